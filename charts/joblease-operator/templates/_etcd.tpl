{{/*
The bundled etcd (etcd.enabled). Its objects are named after the release,
<release>-etcd, so that `helm install joblease` gives joblease-etcd (the name
examples/worker-pod.yaml uses); 52 characters leave room for the StatefulSet's
pod and revision names.
*/}}
{{- define "joblease-operator.etcd.name" -}}
{{- printf "%s-etcd" .Release.Name | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service that gives each member its DNS name (peer traffic). */}}
{{- define "joblease-operator.etcd.peerService" -}}
{{- printf "%s-peer" (include "joblease-operator.etcd.name" .) }}
{{- end }}

{{- define "joblease-operator.etcd.serverSecret" -}}
{{- default (printf "%s-server-tls" (include "joblease-operator.etcd.name" .)) .Values.etcd.certificates.serverSecretName }}
{{- end }}

{{- define "joblease-operator.etcd.clientSecret" -}}
{{- default (printf "%s-client" (include "joblease-operator.etcd.name" .)) .Values.etcd.certificates.clientSecretName }}
{{- end }}

{{/* The root user's Secret (username, password) of the bundled etcd with auth on. */}}
{{- define "joblease-operator.etcd.rootSecret" -}}
{{- default (printf "%s-root" (include "joblease-operator.etcd.name" .)) .Values.etcd.auth.secretName }}
{{- end }}

{{/* The workers' client certificate (CN joblease-worker: no etcd user), copied by the
operator into each tenant Secret. */}}
{{- define "joblease-operator.etcd.workerTlsSecret" -}}
{{- default (printf "%s-worker-tls" (include "joblease-operator.etcd.name" .)) .Values.etcd.certificates.workerSecretName }}
{{- end }}

{{/* Whether the operator gives namespaces tenants, against an etcd with auth. */}}
{{- define "joblease-operator.tenants" -}}
{{- if .Values.tenantCredentials.enabled }}true{{ end }}
{{- end }}

{{/* The namespace label tenants follow (the webhook's opt-in), or empty: JobLeases. */}}
{{- define "joblease-operator.tenantLabel" -}}
{{- if and .Values.tenantCredentials.enabled .Values.webhook.enabled }}
{{- $labels := .Values.webhook.namespaceSelector.matchLabels | default dict }}
{{- if ne (len $labels) 1 }}
{{- fail "tenantCredentials.enabled=true with the webhook follows the injection label: webhook.namespaceSelector.matchLabels needs exactly one label (or set tenantCredentials.enabled=false)" }}
{{- end }}
{{- range $k, $v := $labels }}{{ printf "%s=%s" $k $v }}{{ end }}
{{- end }}
{{- end }}

{{/* Selector labels of the etcd members: a name of their own, so that the operator's
Deployment and metrics Service never select them. */}}
{{- define "joblease-operator.etcd.selectorLabels" -}}
app.kubernetes.io/name: etcd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "joblease-operator.etcd.labels" -}}
helm.sh/chart: {{ include "joblease-operator.chart" . }}
{{ include "joblease-operator.etcd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.etcd.image.tag | quote }}
app.kubernetes.io/component: etcd
app.kubernetes.io/part-of: joblease
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "joblease-operator.etcd.image" -}}
{{- if .Values.etcd.image.digest }}
{{- printf "%s@%s" .Values.etcd.image.repository .Values.etcd.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.etcd.image.repository .Values.etcd.image.tag }}
{{- end }}
{{- end }}

{{/* The DNS name of member $i: <sts>-<i>.<peer service>.<namespace>.svc.<domain>. */}}
{{- define "joblease-operator.etcd.memberHost" -}}
{{- $ := index . 0 }}
{{- printf "%s-%d.%s.%s.svc.%s" (include "joblease-operator.etcd.name" $) (index . 1) (include "joblease-operator.etcd.peerService" $) $.Release.Namespace $.Values.etcd.clusterDomain }}
{{- end }}

{{/* --initial-cluster: every member's name and peer URL. */}}
{{- define "joblease-operator.etcd.initialCluster" -}}
{{- $members := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $members = append $members (printf "%s-%d=https://%s:2380" (include "joblease-operator.etcd.name" $) $i (include "joblease-operator.etcd.memberHost" (list $ $i))) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/* The operator's (and the sidecars') client endpoints: every member, over TLS. */}}
{{- define "joblease-operator.etcd.clientEndpoints" -}}
{{- $endpoints := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $endpoints = append $endpoints (printf "https://%s:2379" (include "joblease-operator.etcd.memberHost" (list $ $i))) }}
{{- end }}
{{- join "," $endpoints }}
{{- end }}

{{/* Checks the etcd values the schema cannot express, or that a values file
without the schema could get wrong. */}}
{{- define "joblease-operator.etcd.validate" -}}
{{- if .Values.etcd.enabled }}
{{- if .Values.etcd.endpoints }}
{{- fail "etcd.endpoints is for your own etcd: set etcd.enabled=false with it (the bundled etcd's endpoints are derived from its members)" }}
{{- end }}
{{- if .Values.etcd.tls.secretName }}
{{- fail "etcd.tls is for your own etcd (etcd.enabled=false); the bundled etcd's certificates are set under etcd.certificates" }}
{{- end }}
{{- if not (has (int .Values.etcd.replicas) (list 1 3)) }}
{{- fail "etcd.replicas must be 1 or 3" }}
{{- end }}
{{- if ne (empty .Values.etcd.certificates.serverSecretName) (empty .Values.etcd.certificates.clientSecretName) }}
{{- fail "etcd.certificates: set both serverSecretName and clientSecretName, or neither (the chart generates both)" }}
{{- end }}
{{- if and .Values.etcd.bundledAuth .Values.etcd.workerSecret.namespaces }}
{{- fail "etcd.workerSecret.namespaces copies the operator's client certificate into worker namespaces; with etcd.bundledAuth=true each namespace labelled for injection gets its own credentials instead (tenantCredentials): remove etcd.workerSecret.namespaces, or set etcd.bundledAuth=false and tenantCredentials.enabled=false to keep the unisolated setup" }}
{{- end }}
{{- if and .Values.tenantCredentials.enabled (not .Values.etcd.bundledAuth) }}
{{- fail "tenantCredentials.enabled=true needs etcd auth: set etcd.bundledAuth=true (the default), or tenantCredentials.enabled=false" }}
{{- end }}
{{- if and .Values.tenantCredentials.enabled .Values.etcd.certificates.serverSecretName (not .Values.etcd.certificates.workerSecretName) }}
{{- fail "tenantCredentials.enabled=true with your own etcd.certificates needs etcd.certificates.workerSecretName: a client certificate for the workers whose CN is no etcd user (the operator's clientSecretName never leaves the release namespace)" }}
{{- end }}
{{- include "joblease-operator.etcd.keepMembers" . }}
{{- else if not .Values.etcd.endpoints }}
{{- fail "etcd.enabled=false needs etcd.endpoints: at least one endpoint of your etcd" }}
{{- else }}
{{- if and .Values.tenantCredentials.enabled (not .Values.etcd.auth.secretName) }}
{{- fail "tenantCredentials.enabled=true with your own etcd (etcd.enabled=false) needs etcd auth on and the operator as root: set etcd.auth.secretName to a Secret with the root username and password (docs/security.md, \"Your own etcd\"), or tenantCredentials.enabled=false" }}
{{- end }}
{{- end }}
{{- with .Values.etcd.auth.secretName }}
{{- /* lookup answers only against a cluster (install, upgrade, --dry-run=server) */}}
{{- if (lookup "v1" "Namespace" "" $.Release.Namespace) }}
{{- if not (lookup "v1" "Secret" $.Release.Namespace .) }}
{{- fail (printf "etcd.auth.secretName: Secret %s does not exist in namespace %s (the etcd root credentials the operator connects with); create it first" . $.Release.Namespace) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Refuses to change the member count of a bundled etcd that exists (helm upgrade).

Every member starts with --initial-cluster-state=new and the member list of
etcd.replicas: a member the StatefulSet adds would bootstrap a second, empty etcd
cluster beside the one holding the jobs (tokens restarting low, the same job claimed
in both), and removing members from 3 leaves the rest without quorum. So the count
the running members were created with (their --initial-cluster; spec.replicas if
that flag is missing) must equal etcd.replicas. It is read back with lookup, which
finds nothing on install and under `helm template` or a client-side --dry-run (then
any count renders); `helm upgrade --dry-run=server` does check it. Comparing the
created member list, not spec.replicas, lets an upgrade with the same count restore
a StatefulSet someone scaled by hand. */}}
{{- define "joblease-operator.etcd.keepMembers" -}}
{{- $name := include "joblease-operator.etcd.name" . }}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace $name }}
{{- if $sts }}
{{- $current := 0 }}
{{- range $sts.spec.template.spec.containers }}
{{- if eq .name "etcd" }}
{{- range .args }}
{{- if hasPrefix "--initial-cluster=" . }}
{{- $current = len (splitList "," (trimPrefix "--initial-cluster=" .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $current }}
{{- $current = int $sts.spec.replicas }}
{{- end }}
{{- $wanted := int .Values.etcd.replicas }}
{{- if ne $current $wanted }}
{{- fail (printf "etcd.replicas: the bundled etcd %s in namespace %s has %d member(s) and this upgrade asks for %d; the chart does not change the member count of a running etcd (new members would start a second, empty etcd cluster; going from 3 to 1 would leave the last member without quorum). Nothing was changed. Keep etcd.replicas=%d, or reinstall with the count you want: see \"Changing the number of etcd members\" in docs/helm.md" $name .Release.Namespace $current $wanted $current) }}
{{- end }}
{{- end }}
{{- end }}

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
{{- else if not .Values.etcd.endpoints }}
{{- fail "etcd.enabled=false needs etcd.endpoints: at least one endpoint of your etcd" }}
{{- end }}
{{- end }}

{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "joblease-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless it already contains it. */}}
{{- define "joblease-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Cluster-scoped objects are shared by every release: qualify them with the namespace. */}}
{{- define "joblease-operator.clusterName" -}}
{{- printf "%s-%s" (include "joblease-operator.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "joblease-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of a release (a Deployment's selector is immutable). */}}
{{- define "joblease-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "joblease-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The recommended app.kubernetes.io/* labels. */}}
{{- define "joblease-operator.labels" -}}
helm.sh/chart: {{ include "joblease-operator.chart" . }}
{{ include "joblease-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: joblease
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "joblease-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "joblease-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "joblease-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The operator's namespaces. The schema already demands one for scope namespaced;
this also guards `--set scope=namespaced` on a values file without the schema.
*/}}
{{- define "joblease-operator.namespaces" -}}
{{- if eq .Values.scope "namespaced" }}
{{- if not .Values.watchNamespaces }}
{{- fail "scope: namespaced needs at least one namespace in watchNamespaces" }}
{{- end }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson list }}
{{- end }}
{{- end }}

{{/*
RBAC rules on JobLeases, shared by the ClusterRole (scope cluster) and each Role
(scope namespaced). Every verb is used; docs/helm.md maps each to its caller.
*/}}
{{- define "joblease-operator.jobleaseRules" -}}
# kopf lists and watches JobLeases and patches them (finalizer, handler
# progress annotations); the status mirror reads one before writing its status.
- apiGroups: ["joblease.io"]
  resources: ["jobleases"]
  verbs: ["get", "list", "watch", "patch"]
# The status mirror replaces the status subresource (a resourceVersion-conditional PUT).
- apiGroups: ["joblease.io"]
  resources: ["jobleases/status"]
  verbs: ["update"]
# JobQueues the same way: kopf lists, watches and patches them (finalizer, progress
# annotations); the queue status refresher reads one and replaces its status.
- apiGroups: ["joblease.io"]
  resources: ["jobqueues"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["joblease.io"]
  resources: ["jobqueues/status"]
  verbs: ["update"]
# JobSemaphores likewise (finalizer, progress annotations; the status refresher).
- apiGroups: ["joblease.io"]
  resources: ["jobsemaphores"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["joblease.io"]
  resources: ["jobsemaphores/status"]
  verbs: ["update"]
# Events: Claimed/Expired/Released/Revoked/Completed/Failed from the mirror, handler failures from kopf.
# Both post core/v1 Events; neither uses events.k8s.io. patch: the mirror writes a
# repeat of an Event as the existing one's count (operator/event_recorder.py).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.tenantCredentials.enabled }}
# Tenant credentials: the operator creates one Secret per namespace and only
# ever reads, replaces or deletes that name (create cannot be name-restricted).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["joblease-etcd-credentials"]
  verbs: ["get", "update", "delete"]
{{- end }}
{{- $workerSecret := include "joblease-operator.sidecarEtcdSecret" . }}
{{- if and .Values.webhook.enabled $workerSecret (ne $workerSecret "joblease-etcd-credentials") }}
# The injection webhook warns at admission when the etcd client Secret an injected
# pod mounts is missing (the pod would stay Pending): get on that one name only.
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ $workerSecret | quote }}]
  verbs: ["get"]
{{- end }}
{{- if .Values.webhook.enabled }}
# The slot webhook reads a CronJob's status.lastScheduleTime when a Job is made from
# it by hand (kubectl create job --from=cronjob/x): get only.
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* The etcd client Secret injected sidecars mount from their namespace (may be empty). */}}
{{- define "joblease-operator.sidecarEtcdSecret" -}}
{{- if and .Values.etcd.enabled .Values.tenantCredentials.enabled }}
{{- default "joblease-etcd-credentials" .Values.webhook.sidecar.etcdClientSecret }}
{{- else if .Values.etcd.enabled }}
{{- default .Values.etcd.workerSecret.name .Values.webhook.sidecar.etcdClientSecret }}
{{- else }}
{{- default .Values.etcd.tls.secretName .Values.webhook.sidecar.etcdClientSecret }}
{{- end }}
{{- end }}

{{/* The injected sidecar's image: webhook.sidecar.image (its tag defaults to appVersion). */}}
{{- define "joblease-operator.sidecarImage" -}}
{{- $img := .Values.webhook.sidecar.image }}
{{- $repo := $img.repository }}
{{- $tag := default .Chart.AppVersion $img.tag }}
{{- if $img.digest }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/* The sidecar injection's settings (operator.injection.SidecarSettings), as JSON. */}}
{{- define "joblease-operator.sidecarSettings" -}}
{{- $s := .Values.webhook.sidecar }}
{{- $endpoints := join "," .Values.etcd.endpoints }}
{{- $secret := include "joblease-operator.sidecarEtcdSecret" . }}
{{- $keys := pick .Values.etcd.tls "caKey" "certKey" "keyKey" }}
{{- if .Values.etcd.enabled }}
{{- $endpoints = include "joblease-operator.etcd.clientEndpoints" . }}
{{- $keys = dict "caKey" "ca.crt" "certKey" "tls.crt" "keyKey" "tls.key" }}
{{- end }}
{{- $settings := dict
      "image" (include "joblease-operator.sidecarImage" .)
      "args" $s.args
      "imagePullPolicy" $s.image.pullPolicy
      "etcdEndpoints" $endpoints
      "etcdRoot" .Values.etcd.root
      "etcdServerName" (ternary "" .Values.etcd.serverName .Values.etcd.enabled)
      "etcdTlsSecret" $secret
      "etcdCaKey" $keys.caKey "etcdCertKey" $keys.certKey "etcdKeyKey" $keys.keyKey
      "tenantCredentials" .Values.tenantCredentials.enabled
      "runAsUser" $s.runAsUser "runAsGroup" $s.runAsGroup
      "resources" $s.resources }}
{{- toPrettyJson $settings }}
{{- end }}

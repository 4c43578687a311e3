{{/* The release's full name, cut to 63 characters (a DNS label). */}}
{{- define "ferry.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "ferry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- end -}}

{{/* What selects the operator's pods (immutable in a Deployment: never add
     to it). The pods' labels are ferry.labels plus the name, a superset. */}}
{{- define "ferry.operatorSelector" -}}
app.kubernetes.io/name: ferry-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ferry.operatorServiceAccount" -}}
{{- default (include "ferry.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ferry.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ferry.stagerImage" -}}
{{- printf "%s:%s" .Values.stager.image.repository (default .Chart.AppVersion .Values.stager.image.tag) -}}
{{- end -}}

{{/* The stager ServiceAccount workers run as, or "" for the namespace's default. */}}
{{- define "ferry.stagerServiceAccount" -}}
{{- if .Values.stager.serviceAccount.create -}}
{{- default "ferry-stager" .Values.stager.serviceAccount.name -}}
{{- else -}}
{{- .Values.stager.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces DataStages live in, as a JSON list: the watched namespace,
     or the ones listed in dataStageNamespaces. */}}
{{- define "ferry.dataStageNamespaces" -}}
{{- if .Values.watchNamespace -}}
{{- list .Values.watchNamespace | toJson -}}
{{- else -}}
{{- .Values.dataStageNamespaces | default list | toJson -}}
{{- end -}}
{{- end -}}

{{/*
What both pod webhooks share: the Service they call, CREATE of pods, and
the namespaces they never see. Called with (dict "root" . "service" NAME
"excluded" LIST).
*/}}
{{- define "ferry.webhookCommon" -}}
clientConfig:
  service:
    name: {{ .service }}
    namespace: {{ .root.Release.Namespace }}
    path: /mutate-pods
    port: 443
rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["CREATE"]
    resources: ["pods"]
    scope: Namespaced
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: {{ if .root.Values.watchNamespace }}In{{ else }}NotIn{{ end }}
      values:
        {{- if .root.Values.watchNamespace }}
        - {{ .root.Values.watchNamespace }}
        {{- else }}
        {{- toYaml .excluded | nindent 8 }}
        {{- end }}
admissionReviewVersions: ["v1"]
sideEffects: None
timeoutSeconds: {{ .root.Values.webhook.timeoutSeconds }}
# The mutation is idempotent: a later webhook that adds a container gets
# the data mounted too.
reinvocationPolicy: IfNeeded
{{- end }}

{{/* The namespace the workers of node-local DataStages run in. */}}
{{- define "ferry.workersNamespace" -}}
{{- default (printf "%s-workers" .Release.Name | trunc 63 | trimSuffix "-") .Values.workers.namespace -}}
{{- end -}}

{{/* The operator's ServiceAccount as the API server names its user. */}}
{{- define "ferry.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "ferry.operatorServiceAccount" .) -}}
{{- end -}}

{{/* The port workers serve their peers on: fixed in the operator
     (ferry_contract::peers::DEFAULT_PEER_PORT; operator/src/peers.rs has a
     test that the two agree), shared here by every template that names it. */}}
{{- define "ferry.peerPort" -}}
9466
{{- end -}}

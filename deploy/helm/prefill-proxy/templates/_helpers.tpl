{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "prefill-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name: the release, plus the chart name unless the release already has it. */}}
{{- define "prefill-proxy.fullname" -}}
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

{{- define "prefill-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefill-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prefill-proxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "prefill-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The proxy's upstream: proxy.upstream, or the sidecar vLLM over loopback. */}}
{{- define "prefill-proxy.upstream" -}}
{{- .Values.proxy.upstream | default (printf "http://127.0.0.1:%d" (int .Values.vllm.port)) }}
{{- end }}

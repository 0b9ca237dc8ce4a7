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

{{/* The proxy's upstream: proxy.upstream; else the sidecar vLLM over loopback, or in
gateway mode the engines' headless Service (one engine per pod address). */}}
{{- define "prefill-proxy.upstream" -}}
{{- if .Values.proxy.upstream }}
{{- .Values.proxy.upstream }}
{{- else if eq .Values.mode "gateway" }}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "prefill-proxy.engines" .) .Release.Namespace (int .Values.vllm.port) }}
{{- else }}
{{- printf "http://127.0.0.1:%d" (int .Values.vllm.port) }}
{{- end }}
{{- end }}

{{/* The vLLM container (the sidecar pod's, or each engine pod's in gateway mode). */}}
{{- define "prefill-proxy.vllmContainer" -}}
- name: vllm
  image: "{{ .Values.vllm.image.repository }}:{{ .Values.vllm.image.tag }}"
  imagePullPolicy: {{ .Values.vllm.image.pullPolicy }}
  args:
    - --model={{ .Values.vllm.model }}
    {{- with .Values.vllm.servedModelName }}
    - --served-model-name={{ . }}
    {{- end }}
    - --port={{ .Values.vllm.port | int }}
    - --enable-prefix-caching
    - --enable-prompt-tokens-details
    {{- if and .Values.proxy.warmup.enabled (gt (int .Values.proxy.warmup.priority) 0) (not (regexMatch "--scheduling-policy" (join " " .Values.vllm.extraArgs))) }}
    # Warm-ups carry a priority (proxy.warmup.priority): vLLM rejects one otherwise.
    - --scheduling-policy=priority
    {{- end }}
    {{- range .Values.vllm.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  {{- with .Values.vllm.env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: vllm
      containerPort: {{ .Values.vllm.port | int }}
  startupProbe:
    httpGet:
      path: /health
      port: vllm
    periodSeconds: {{ .Values.vllm.startupProbe.periodSeconds | int }}
    failureThreshold: {{ .Values.vllm.startupProbe.failureThreshold | int }}
  livenessProbe:
    httpGet:
      path: /health
      port: vllm
    periodSeconds: 10
  resources:
    {{- toYaml .Values.vllm.resources | nindent 4 }}
  volumeMounts:
    - name: shm
      mountPath: /dev/shm
{{- end }}

{{/* The proxy container; its settings come from the ConfigMap. */}}
{{- define "prefill-proxy.proxyContainer" -}}
- name: prefill-proxy
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  envFrom:
    - configMapRef:
        name: {{ include "prefill-proxy.fullname" . }}
  ports:
    - name: proxy
      containerPort: {{ .Values.proxy.port | int }}
  livenessProbe:
    httpGet:
      path: /health
      port: proxy
    periodSeconds: 10
    timeoutSeconds: 3
  readinessProbe:
    httpGet:
      path: /ready
      port: proxy
    periodSeconds: 5
    timeoutSeconds: 3
  resources:
    {{- toYaml .Values.proxy.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
{{- end }}

{{/* The pod's security context and scheduling, shared by every pod of the chart. */}}
{{- define "prefill-proxy.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* Where the proxy's settings say the engines are. */}}
{{- define "prefill-proxy.engines" -}}
{{- printf "%s-engines" (include "prefill-proxy.fullname" .) }}
{{- end }}

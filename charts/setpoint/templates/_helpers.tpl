{{/*
The chart name, or nameOverride.
*/}}
{{- define "setpoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources: fullnameOverride, else
<release>-<chart> (just <release> when it already contains the chart name).
Truncated to 63 characters, as DNS names must be.
*/}}
{{- define "setpoint.fullname" -}}
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

{{/*
The name of one role's resources: (dict "root" . "component" "webhook").
*/}}
{{- define "setpoint.componentName" -}}
{{- printf "%s-%s" (include "setpoint.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The helm.sh/chart label: <chart>-<version>.
*/}}
{{- define "setpoint.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The app.kubernetes.io/version label: the image tag (default: appVersion).
*/}}
{{- define "setpoint.versionLabel" -}}
{{- default .Chart.AppVersion .Values.image.tag | toString | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels of every resource.
*/}}
{{- define "setpoint.labels" -}}
helm.sh/chart: {{ include "setpoint.chart" . }}
{{ include "setpoint.selectorLabels" . }}
app.kubernetes.io/version: {{ include "setpoint.versionLabel" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: setpoint
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/*
The labels that select the release's pods.
*/}}
{{- define "setpoint.selectorLabels" -}}
app.kubernetes.io/name: {{ include "setpoint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The labels of one role's resources: (dict "root" . "component" "worker").
*/}}
{{- define "setpoint.componentLabels" -}}
{{ include "setpoint.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
The labels that select one role's pods: (dict "root" . "component" "worker").
*/}}
{{- define "setpoint.componentSelectorLabels" -}}
{{ include "setpoint.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
The ServiceAccount every role runs as.
*/}}
{{- define "setpoint.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "setpoint.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference.
*/}}
{{- define "setpoint.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/*
The ConfigMap holding setpoint.yaml.
*/}}
{{- define "setpoint.configMapName" -}}
{{- printf "%s-config" (include "setpoint.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The Secret holding the RabbitMQ URL.
*/}}
{{- define "setpoint.amqpSecretName" -}}
{{- if .Values.amqp.existingSecret }}
{{- .Values.amqp.existingSecret }}
{{- else }}
{{- printf "%s-amqp" (include "setpoint.fullname" .) | trunc 253 }}
{{- end }}
{{- end }}

{{/*
The pod template's metadata: (dict "root" . "role" .Values.worker "component" "worker").
Labels: the role's own, then podLabels; annotations: the config checksum
(so that a config change rolls the pods), then podAnnotations.
*/}}
{{- define "setpoint.podMetadata" -}}
{{- $root := .root }}
{{- $labels := fromYaml (include "setpoint.componentLabels" (dict "root" $root "component" .component)) }}
{{- $labels = merge $labels (deepCopy (.role.podLabels | default dict)) (deepCopy ($root.Values.podLabels | default dict)) }}
{{- $annotations := dict "checksum/config" (toYaml $root.Values.config | sha256sum) }}
{{- $annotations = merge $annotations (deepCopy (.role.podAnnotations | default dict)) (deepCopy ($root.Values.podAnnotations | default dict)) -}}
metadata:
  labels:
    {{- range $key, $value := $labels }}
    {{ $key }}: {{ $value | toString | quote }}
    {{- end }}
  annotations:
    {{- range $key, $value := $annotations }}
    {{ $key }}: {{ $value | toString | quote }}
    {{- end }}
{{- end }}

{{/*
What every role's pod spec shares: (dict "root" . "role" .Values.worker).
*/}}
{{- define "setpoint.podSpecCommon" -}}
{{- $root := .root }}
{{- $role := .role -}}
serviceAccountName: {{ include "setpoint.serviceAccountName" $root }}
# Setpoint talks to the API server.
automountServiceAccountToken: true
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($role.nodeSelector | default $root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($role.tolerations | default $root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($role.affinity | default $root.Values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
What every Setpoint container shares, after its name and args:
(dict "root" . "role" .Values.worker). Image, security context, the metrics
port, probes on it, resources.
*/}}
{{- define "setpoint.containerCommon" -}}
{{- $root := .root }}
{{- $role := .role -}}
image: {{ include "setpoint.image" $root | quote }}
imagePullPolicy: {{ $root.Values.image.pullPolicy }}
{{- with $root.Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- with $role.livenessProbe }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- with $role.readinessProbe }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $role.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The container port every role serves /metrics, /healthz and /readyz on.
*/}}
{{- define "setpoint.metricsPort" -}}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end }}

{{/*
The environment every role shares: (dict "root" . "role" .Values.worker).
RabbitMQ, the metrics address, the pod's namespace (the sweep's Lease) and
name (the Events' reporting instance), then extraEnv and the role's extraEnv.
*/}}
{{- define "setpoint.env" -}}
{{- $root := .root -}}
- name: SETPOINT_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "setpoint.amqpSecretName" $root }}
      key: {{ $root.Values.amqp.key }}
- name: SETPOINT_AMQP_PREFIX
  value: {{ $root.Values.amqp.prefix | quote }}
- name: SETPOINT_AMQP_SHARDS
  value: {{ $root.Values.amqp.shards | toString | quote }}
- name: SETPOINT_AMQP_QUEUE_TYPE
  value: {{ $root.Values.amqp.queueType | quote }}
- name: SETPOINT_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%v" $root.Values.metrics.port | quote }}
- name: SETPOINT_CACHE_DIR
  value: /var/cache/setpoint
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .role.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The volume mounts every role shares: the config file, and the image's two
writable directories (its root filesystem is read-only): /tmp and the cache
/var/cache/setpoint (SETPOINT_CACHE_DIR and HOME: Git mirrors, render
scratch, helm's and kubectl's caches), then extraVolumeMounts.
*/}}
{{- define "setpoint.volumeMounts" -}}
- name: config
  mountPath: /etc/setpoint/setpoint.yaml
  subPath: setpoint.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /var/cache/setpoint
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The volumes every role shares, then extraVolumes: (dict "root" . "cache"
.Values.worker.cache), the cache's emptyDir settings (sizeLimit, medium).
*/}}
{{- define "setpoint.volumes" -}}
{{- $settings := .cache | default dict }}
{{- $cache := dict }}
{{- with $settings.medium }}{{ $_ := set $cache "medium" . }}{{ end }}
{{- with $settings.sizeLimit }}{{ $_ := set $cache "sizeLimit" . }}{{ end -}}
- name: config
  configMap:
    name: {{ include "setpoint.configMapName" .root }}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {{- toYaml $cache | nindent 4 }}
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A volume of one key of a Secret: (dict "name" "github-secret" "secret" "my-secret" "key" "secret").
*/}}
{{- define "setpoint.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end }}

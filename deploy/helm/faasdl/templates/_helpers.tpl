{{/* The chart's name, cut to Kubernetes' 63 characters. */}}
{{- define "faasdl.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's resource name prefix (the release's name alone when it holds the chart's). */}}
{{- define "faasdl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "faasdl.labels" -}}
app.kubernetes.io/name: {{ include "faasdl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The state store's URL as the controller and the actions reach it. */}}
{{- define "faasdl.storeUrl" -}}
{{- if eq .Values.store.kind "redis" -}}
{{- if not .Values.redis.enabled -}}
{{- fail "store.kind is redis but redis.enabled is false: the controller would have no store (the chart's store is the one it deploys: enable it, or set store.kind=ignite with ignite.enabled=true)" -}}
{{- end -}}
redis://{{ include "faasdl.fullname" . }}-redis.{{ .Release.Namespace }}.svc.cluster.local:6379/0
{{- else if eq .Values.store.kind "ignite" -}}
{{- if not .Values.ignite.enabled -}}
{{- fail "store.kind is ignite but ignite.enabled is false: the controller would have no store (the chart's store is the one it deploys: enable it, or set store.kind=redis with redis.enabled=true)" -}}
{{- end -}}
ignite://{{ include "faasdl.fullname" . }}-ignite.{{ .Release.Namespace }}.svc.cluster.local:10800?prefix=faasdl
{{- else -}}
{{- fail "store.kind must be redis or ignite" -}}
{{- end -}}
{{- end -}}

{{/* Whether the store is the chart's Redis with a password ("true", or empty). */}}
{{- define "faasdl.redisPassword" -}}
{{- if and (eq .Values.store.kind "redis") .Values.redis.enabled .Values.redis.auth -}}
true
{{- end -}}
{{- end -}}

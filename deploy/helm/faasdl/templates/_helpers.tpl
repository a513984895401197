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
{{- if not (has .Values.store.kind (list "redis" "ignite")) -}}
{{- fail "store.kind must be redis or ignite" -}}
{{- end -}}
{{- if .Values.store.url -}}
{{- $scheme := (urlParse .Values.store.url).scheme -}}
{{- $schemes := ternary (list "redis" "rediss") (list "ignite") (eq .Values.store.kind "redis") -}}
{{- if not (has $scheme $schemes) -}}
{{- fail (printf "store.url's scheme is %s://, not a %s store's (store.kind): %s://" $scheme .Values.store.kind (join ":// or " $schemes)) -}}
{{- end -}}
{{- if (index .Values .Values.store.kind).enabled -}}
{{- fail (printf "store.url names a store of your own: set %s.enabled=false (the chart's would run unused)" .Values.store.kind) -}}
{{- end -}}
{{- if and .Values.store.tlsCaSecretKey (not (has $scheme (list "rediss" "ignite"))) -}}
{{- fail "store.tlsCaSecretKey: a CA bundle is for a store reached with TLS, a rediss:// or ignite:// store.url" -}}
{{- end -}}
{{- .Values.store.url -}}
{{- else -}}
{{- if or .Values.store.passwordSecretKey .Values.store.tlsCaSecretKey -}}
{{- fail "store.passwordSecretKey and store.tlsCaSecretKey are for a store of your own (store.url); the chart's Redis asks for the Secret's redis-password (redis.auth)" -}}
{{- end -}}
{{- if eq .Values.store.kind "redis" -}}
{{- if not .Values.redis.enabled -}}
{{- fail "store.kind is redis but redis.enabled is false: the controller would have no store (enable the chart's, or name yours in store.url)" -}}
{{- end -}}
redis://{{ include "faasdl.fullname" . }}-redis.{{ .Release.Namespace }}.svc.cluster.local:6379/0
{{- else -}}
{{- if not .Values.ignite.enabled -}}
{{- fail "store.kind is ignite but ignite.enabled is false: the controller would have no store (enable the chart's, or name yours in store.url)" -}}
{{- end -}}
ignite://{{ include "faasdl.fullname" . }}-ignite.{{ .Release.Namespace }}.svc.cluster.local:10800?prefix=faasdl
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret's key holding the store's password (empty: none): the chart's Redis's with
redis.auth, or store.passwordSecretKey for a store of your own. */}}
{{- define "faasdl.storePasswordKey" -}}
{{- if .Values.store.url -}}
{{- .Values.store.passwordSecretKey -}}
{{- else if and (eq .Values.store.kind "redis") .Values.redis.enabled .Values.redis.auth -}}
redis-password
{{- end -}}
{{- end -}}

{{- define "composer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "composer.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "composer.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "composer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The environment every container shares: non-secret settings, development off, secrets from existingSecret. */}}
{{- define "composer.env" -}}
env:
  - name: COMPOSER_DEV
    value: "false"
  - name: COMPOSER_HTTP_ADDR
    value: "0.0.0.0:{{ .Values.server.service.port }}"
  - name: COMPOSER_ADMIN_ADDR
    value: "0.0.0.0:{{ .Values.server.service.adminPort }}"
  - name: COMPOSER_SERVER_URL
    value: "http://{{ include "composer.fullname" . }}-server:{{ .Values.server.service.port }}"
  {{- if .Values.jwks.existingSecret }}
  - name: COMPOSER_JWKS_FILE
    value: /run/secrets/composer/jwks.json
  {{- end }}
  {{- range $k, $v := .Values.env }}
  - name: {{ $k }}
    value: {{ $v | quote }}
  {{- end }}
envFrom:
  - secretRef:
      name: {{ required "existingSecret: the Secret holding the database URLs, Redis URL, worker token, webhook key and audit key" .Values.existingSecret }}
{{- end -}}

{{- define "composer.pod" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext: {{ toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.jwks.existingSecret }}
volumes:
  - name: jwks
    secret:
      secretName: {{ .Values.jwks.existingSecret }}
      items:
        - key: {{ .Values.jwks.key }}
          path: jwks.json
{{- end }}
{{- end -}}

{{- define "composer.mounts" -}}
{{- if .Values.jwks.existingSecret }}
volumeMounts:
  - name: jwks
    mountPath: /run/secrets/composer
    readOnly: true
{{- end }}
{{- end -}}

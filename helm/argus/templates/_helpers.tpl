{{/*
Names and labels, in the OpenTelemetry Collector chart's conventions.
*/}}
{{- define "argus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "argus.fullname" -}}
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

{{- define "argus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "argus.labels" -}}
helm.sh/chart: {{ include "argus.chart" . }}
{{ include "argus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: argus
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "argus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "argus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component: (dict "ctx" $ "component" "worker") */}}
{{- define "argus.componentLabels" -}}
{{ include "argus.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "argus.componentSelectorLabels" -}}
{{ include "argus.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "argus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "argus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "argus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Secret names: an existing Secret (recommended) or the one this chart creates. */}}
{{- define "argus.kafkaSaslSecret" -}}
{{- default (printf "%s-kafka-sasl" (include "argus.fullname" .)) .Values.kafka.sasl.existingSecret }}
{{- end }}
{{- define "argus.kafkaTlsSecret" -}}
{{- default (printf "%s-kafka-tls" (include "argus.fullname" .)) .Values.kafka.tls.existingSecret }}
{{- end }}
{{- define "argus.clickhouseSecret" -}}
{{- default (printf "%s-clickhouse" (include "argus.fullname" .)) .Values.clickhouse.existingSecret }}
{{- end }}
{{- define "argus.grafanaSecret" -}}
{{- default (printf "%s-grafana" (include "argus.fullname" .)) .Values.grafana.existingSecret }}
{{- end }}

{{- define "argus.saslEnabled" -}}
{{- if hasPrefix "SASL" (upper .Values.kafka.securityProtocol) }}true{{ end }}
{{- end }}
{{- define "argus.tlsEnabled" -}}
{{- if or (eq (upper .Values.kafka.securityProtocol) "SSL") (eq (upper .Values.kafka.securityProtocol) "SASL_SSL") }}true{{ end }}
{{- end }}

{{/*
Kafka settings of every Argus container. Passwords are files from mounted Secrets
(ARGUS_*_FILE), never environment values.
*/}}
{{- define "argus.kafkaEnv" -}}
- name: ARGUS_KAFKA_BOOTSTRAP
  value: {{ required "kafka.bootstrap is required" .Values.kafka.bootstrap | quote }}
- name: ARGUS_KAFKA_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: ARGUS_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if include "argus.saslEnabled" . }}
- name: ARGUS_KAFKA_SASL_MECHANISM
  value: {{ required "kafka.sasl.mechanism is required with a SASL security protocol" .Values.kafka.sasl.mechanism | quote }}
- name: ARGUS_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ include "argus.kafkaSaslSecret" . }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: ARGUS_KAFKA_SASL_PASSWORD_FILE
  value: /etc/argus/secrets/kafka-sasl/{{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "argus.tlsEnabled" . }}
- name: ARGUS_KAFKA_SSL_CA
  value: /etc/argus/secrets/kafka-tls/{{ .Values.kafka.tls.caKey }}
{{- if .Values.kafka.tls.certKey }}
- name: ARGUS_KAFKA_SSL_CERT
  value: /etc/argus/secrets/kafka-tls/{{ .Values.kafka.tls.certKey }}
- name: ARGUS_KAFKA_SSL_KEY
  value: /etc/argus/secrets/kafka-tls/{{ .Values.kafka.tls.keyKey }}
{{- end }}
{{- end }}
{{- end }}

{{- define "argus.kafkaVolumeMounts" -}}
{{- if include "argus.saslEnabled" . }}
- name: kafka-sasl
  mountPath: /etc/argus/secrets/kafka-sasl
  readOnly: true
{{- end }}
{{- if include "argus.tlsEnabled" . }}
- name: kafka-tls
  mountPath: /etc/argus/secrets/kafka-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "argus.kafkaVolumes" -}}
{{- if include "argus.saslEnabled" . }}
- name: kafka-sasl
  secret:
    secretName: {{ include "argus.kafkaSaslSecret" . }}
    items:
      - key: {{ .Values.kafka.sasl.passwordKey }}
        path: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "argus.tlsEnabled" . }}
- name: kafka-tls
  secret:
    secretName: {{ include "argus.kafkaTlsSecret" . }}
{{- end }}
{{- end }}

{{/* The pod-level settings shared by every Argus workload. */}}
{{- define "argus.podCommon" -}}
serviceAccountName: {{ include "argus.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

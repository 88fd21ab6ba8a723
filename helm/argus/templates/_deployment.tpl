{{/*
One Argus Deployment (stream workers, sink): (dict "ctx" $ "component" "worker" "spec" .Values.worker
"args" (list ...) "env" "<yaml list>" "volumeMounts" "<yaml>" "volumes" "<yaml>" "replicas" true)
*/}}
{{- define "argus.deployment" -}}
{{- $ctx := .ctx }}
{{- $spec := .spec }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "argus.fullname" $ctx }}-{{ .component }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "argus.componentLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  {{- if .replicas }}
  replicas: {{ $spec.replicaCount }}
  {{- end }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "argus.componentSelectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "argus.componentSelectorLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $spec.metricsPort | quote }}
        {{- with $spec.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "argus.podCommon" $ctx | nindent 6 }}
      terminationGracePeriodSeconds: 60
      containers:
        - name: {{ .component }}
          image: {{ include "argus.image" $ctx | quote }}
          imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          env:
            - name: ARGUS_HOME
              value: /var/lib/argus
            - name: ARGUS_METRICS_ADDR  # /metrics on the pod's IP (Prometheus, probes), not 0.0.0.0
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- include "argus.kafkaEnv" $ctx | nindent 12 }}
            {{- with .env }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $spec.extraEnvs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $spec.metricsPort }}
              protocol: TCP
          {{- with $spec.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $spec.readinessProbe }}
          readinessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          resources:
            {{- toYaml $spec.resources | nindent 12 }}
          {{- with $ctx.Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: data
              mountPath: /var/lib/argus
            - name: tmp
              mountPath: /tmp
            {{- with (include "argus.kafkaVolumeMounts" $ctx) }}{{- . | trim | nindent 12 }}{{- end }}
            {{- with .volumeMounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        - name: data
          emptyDir: {}
        - name: tmp
          emptyDir: {}
        {{- with (include "argus.kafkaVolumes" $ctx) }}{{- . | trim | nindent 8 }}{{- end }}
        {{- with .volumes }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- with $spec.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "argus.fullname" $ctx }}-{{ .component }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "argus.componentLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  type: ClusterIP
  ports:
    - name: metrics
      port: {{ $spec.metricsPort }}
      targetPort: metrics
      protocol: TCP
  selector:
    {{- include "argus.componentSelectorLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
{{- end }}

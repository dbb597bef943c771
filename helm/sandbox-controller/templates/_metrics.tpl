{{/*
The metrics port of the worker and scheduler containers (GET /metrics on CONTROLLER_METRICS_PORT).
*/}}
{{- define "sandbox-controller.metricsContainerExtra" -}}
{{- if .Values.metrics.port }}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
{{- end }}
{{- end }}

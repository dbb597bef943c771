{{/*
The pod template shared by receiver, worker and scheduler.
Call with (dict "root" $ "component" "worker" "values" .Values.worker "args" (list "worker") "webhook" false "apiKey" true "token" true "extra" "<container yaml>")
*/}}
{{- define "sandbox-controller.podTemplate" -}}
{{- $root := .root -}}
metadata:
  labels:
    {{- include "sandbox-controller.componentLabels" . | nindent 4 }}
  annotations:
    checksum/config: {{ include "sandbox-controller.configChecksum" $root }}
    {{- with .values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "sandbox-controller.serviceAccountName" $root }}
  # Only pods that talk to the Kubernetes API get a token.
  automountServiceAccountToken: {{ .token }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  securityContext:
    {{- include "sandbox-controller.podSecurityContext" $root | nindent 4 }}
  {{- with .values.terminationGracePeriodSeconds }}
  terminationGracePeriodSeconds: {{ . }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "sandbox-controller.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: ["sandbox-controller"]
      args:
        {{- toYaml .args | nindent 8 }}
      securityContext:
        {{- include "sandbox-controller.containerSecurityContext" $root | nindent 8 }}
      envFrom:
        - configMapRef:
            name: {{ include "sandbox-controller.fullname" $root }}
      env:
        {{- include "sandbox-controller.commonEnv" $root | nindent 8 }}
        {{- if .webhook }}
        - name: CONTROLLER_WEBHOOK_SECRETS_FILE
          value: {{ include "sandbox-controller.webhookSecretsPath" $root | quote }}
        {{- end }}
        {{- if .apiKey }}
        - name: CONTROLLER_API_KEY_FILE
          value: {{ include "sandbox-controller.apiKeyPath" $root | quote }}
        {{- end }}
        {{- with $root.Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .extra }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with .values.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml .values.resources | nindent 8 }}
      volumeMounts:
        {{- include "sandbox-controller.commonVolumeMounts" $root | nindent 8 }}
        {{- if .webhook }}
        - name: webhook-secrets
          mountPath: {{ include "sandbox-controller.webhookSecretsPath" $root | dir }}
          readOnly: true
        {{- end }}
        {{- if .apiKey }}
        {{- include "sandbox-controller.apiKeyMount" $root | nindent 8 }}
        {{- end }}
  volumes:
    {{- include "sandbox-controller.commonVolumes" $root | nindent 4 }}
    {{- if .webhook }}
    - name: webhook-secrets
      secret:
        secretName: {{ include "sandbox-controller.webhookSecretName" $root }}
        defaultMode: 0440
        items:
          - key: {{ $root.Values.webhook.existingSecretKey }}
            path: {{ include "sandbox-controller.webhookSecretsPath" $root | base }}
    {{- end }}
    {{- if .apiKey }}
    {{- include "sandbox-controller.apiKeyVolume" $root | nindent 4 }}
    {{- end }}
  {{- with .values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

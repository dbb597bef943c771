{{/*
The CA bundle sandbox pods trust (sandbox.caBundle): the ConfigMap the chart makes from pem, or
an existing one; "" when neither is set (the image's own CAs).
*/}}
{{- define "sandbox-controller.caBundleConfigMapName" -}}
{{- if .Values.sandbox.caBundle.existingConfigMap }}
{{- .Values.sandbox.caBundle.existingConfigMap }}
{{- else if .Values.sandbox.caBundle.pem }}
{{- include "sandbox-controller.componentName" (dict "root" . "component" "ca-bundle") }}
{{- end }}
{{- end }}

{{- define "sandbox-controller.validateCaBundle" -}}
{{- $ca := .Values.sandbox.caBundle }}
{{- if and $ca.pem $ca.existingConfigMap }}
{{- fail "sandbox.caBundle: set sandbox.caBundle.pem or sandbox.caBundle.existingConfigMap, not both" }}
{{- end }}
{{- if and $ca.pem (not (contains "-----BEGIN CERTIFICATE-----" $ca.pem)) }}
{{- fail "sandbox.caBundle.pem must hold PEM certificates (-----BEGIN CERTIFICATE----- blocks)" }}
{{- end }}
{{- end }}

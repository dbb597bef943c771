{{/*
Expand the name of the chart.
*/}}
{{- define "sandbox-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name (63 characters at most, the DNS label limit).
If the release name contains the chart name it is used as the full name.
*/}}
{{- define "sandbox-controller.fullname" -}}
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
A component's name: fullname plus a suffix, still at most 63 characters.
*/}}
{{- define "sandbox-controller.componentName" -}}
{{- $full := include "sandbox-controller.fullname" .root }}
{{- printf "%s-%s" ($full | trunc (int (sub 62 (len .component)))) .component | trimSuffix "-" }}
{{- end }}

{{/*
Create chart name and version as used by the chart label.
*/}}
{{- define "sandbox-controller.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels
*/}}
{{- define "sandbox-controller.labels" -}}
helm.sh/chart: {{ include "sandbox-controller.chart" . }}
{{ include "sandbox-controller.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-controller
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels
*/}}
{{- define "sandbox-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels and selector labels of one component: (dict "root" $ "component" "worker")
*/}}
{{- define "sandbox-controller.componentLabels" -}}
{{ include "sandbox-controller.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sandbox-controller.componentSelectorLabels" -}}
{{ include "sandbox-controller.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Create the name of the service account to use
*/}}
{{- define "sandbox-controller.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-controller.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The controller image.
*/}}
{{- define "sandbox-controller.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The namespace sandbox pods run in.
*/}}
{{- define "sandbox-controller.sandboxNamespace" -}}
{{- .Values.sandbox.namespace.name | default (printf "%s-sandboxes" (default "default" .Release.Namespace)) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Secret names and keys: chart-made or existing.
*/}}
{{- define "sandbox-controller.webhookSecretName" -}}
{{- .Values.webhook.existingSecret | default (include "sandbox-controller.componentName" (dict "root" . "component" "webhook")) }}
{{- end }}

{{- define "sandbox-controller.apiKeySecretName" -}}
{{- .Values.apiKey.existingSecret | default (include "sandbox-controller.componentName" (dict "root" . "component" "api-key")) }}
{{- end }}

{{/*
The Secret holding the controller's Redis URL (key redis.existingSecretKey): for the bundled
Redis the auth Secret (which also holds its password), else the external URL's Secret.
*/}}
{{- define "sandbox-controller.redisSecretName" -}}
{{- if .Values.redis.enabled }}
{{- include "sandbox-controller.redisAuthSecretName" . }}
{{- else }}
{{- .Values.redis.existingSecret | default (include "sandbox-controller.componentName" (dict "root" . "component" "redis-url")) }}
{{- end }}
{{- end }}

{{/*
The bundled Redis's password (key redis-password) and the matching URL: chart-made or existing.
*/}}
{{- define "sandbox-controller.redisAuthSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (include "sandbox-controller.componentName" (dict "root" . "component" "redis-auth")) }}
{{- end }}

{{- define "sandbox-controller.redisName" -}}
{{- include "sandbox-controller.componentName" (dict "root" . "component" "redis") }}
{{- end }}

{{- define "sandbox-controller.executorKeySecretName" -}}
{{- .Values.sandbox.executorKey.existingSecret | default (include "sandbox-controller.componentName" (dict "root" . "component" "executor-key")) }}
{{- end }}

{{/*
Images sandbox pods may run, as a CEL list literal: sandbox.image, every template's image and
sandbox.podPolicy.extraImages.
*/}}
{{- define "sandbox-controller.sandboxImages" -}}
{{- concat (include "sandbox-controller.runnerImages" . | fromJsonArray) .Values.sandbox.podPolicy.extraImages | uniq | toJson }}
{{- end }}

{{/*
The runner image of every sandbox template (sandbox.image and each template's image), a JSON
list without repeats: what the pre-puller keeps on every node (sandbox.prePuller).
*/}}
{{- define "sandbox-controller.runnerImages" -}}
{{- $images := list (printf "%s:%s" .Values.sandbox.image.repository .Values.sandbox.image.tag) }}
{{- range $name, $template := .Values.sandbox.templates }}
{{- with $template.image }}
{{- $images = append $images . }}
{{- end }}
{{- end }}
{{- $images | uniq | toJson }}
{{- end }}

{{- define "sandbox-controller.templatesConfigMapName" -}}
{{- include "sandbox-controller.componentName" (dict "root" . "component" "sandbox-templates") }}
{{- end }}

{{/*
Where the mounted files live inside the controller's containers.
*/}}
{{- define "sandbox-controller.webhookSecretsPath" -}}/var/run/secrets/sandbox-controller/webhook/secrets{{- end }}
{{- define "sandbox-controller.apiKeyPath" -}}/var/run/secrets/sandbox-controller/api/key{{- end }}
{{- define "sandbox-controller.templatesPath" -}}/etc/sandbox-controller/templates/templates.json{{- end }}
{{- define "sandbox-controller.redisSentinelPasswordPath" -}}/var/run/secrets/sandbox-controller/redis-sentinel/password{{- end }}
{{- define "sandbox-controller.redisCaPath" -}}/etc/sandbox-controller/redis-ca/ca.crt{{- end }}

{{/*
Impossible combinations fail the render with a message that says what to set.
*/}}
{{- define "sandbox-controller.validate" -}}
{{- if and (not .Values.redis.enabled) (not .Values.redis.url) (not .Values.redis.existingSecret) }}
{{- fail "redis: the bundled Redis is disabled (redis.enabled=false): set redis.url or redis.existingSecret" }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.redis.url .Values.redis.existingSecret) }}
{{- fail "redis: set either redis.enabled=true (bundled) or redis.url/redis.existingSecret (external), not both" }}
{{- end }}
{{- if and (not .Values.redis.enabled) .Values.redis.auth.existingSecret }}
{{- fail "redis.auth.existingSecret is for the bundled Redis (redis.enabled=true); an external Redis's URL carries its own password" }}
{{- end }}
{{- if and .Values.redis.url .Values.redis.existingSecret }}
{{- fail "redis: set redis.url or redis.existingSecret, not both" }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.redis.sentinel.addresses .Values.redis.sentinel.existingSecret .Values.redis.tls.caSecret) }}
{{- fail "redis.sentinel and redis.tls are for an external Redis (redis.enabled=false with redis.url or redis.existingSecret); the bundled Redis is one pod, without Sentinel or TLS" }}
{{- end }}
{{- if and (not .Values.redis.sentinel.addresses) (or .Values.redis.sentinel.masterName .Values.redis.sentinel.existingSecret) }}
{{- fail "redis.sentinel.masterName and redis.sentinel.existingSecret need redis.sentinel.addresses" }}
{{- end }}
{{- if and .Values.redis.tls.caSecret .Values.redis.url (not (hasPrefix "rediss://" .Values.redis.url)) }}
{{- fail "redis.tls.caSecret is for TLS: redis.url must be a rediss:// URL" }}
{{- end }}
{{- if and (not .Values.webhook.signingSecrets) (not .Values.webhook.existingSecret) }}
{{- fail "webhook: no signing secret: set webhook.signingSecrets (from `POST /v1/webhook_endpoints`) or webhook.existingSecret" }}
{{- end }}
{{- if and .Values.webhook.signingSecrets .Values.webhook.existingSecret }}
{{- fail "webhook: set webhook.signingSecrets or webhook.existingSecret, not both" }}
{{- end }}
{{- if and (not .Values.apiKey.value) (not .Values.apiKey.existingSecret) }}
{{- fail "apiKey: the worker reads sessions with an API key: set apiKey.value or apiKey.existingSecret" }}
{{- end }}
{{- if and .Values.apiKey.value .Values.apiKey.existingSecret }}
{{- fail "apiKey: set apiKey.value or apiKey.existingSecret, not both" }}
{{- end }}
{{- if and (not .Values.sandbox.executorKey.value) (not .Values.sandbox.executorKey.existingSecret) }}
{{- fail "sandbox.executorKey: set sandbox.executorKey.value or sandbox.executorKey.existingSecret (a Secret in the sandbox namespace with key executor-key)" }}
{{- end }}
{{- if and .Values.sandbox.executorKey.value .Values.sandbox.executorKey.existingSecret }}
{{- fail "sandbox.executorKey: set sandbox.executorKey.value or sandbox.executorKey.existingSecret, not both" }}
{{- end }}
{{- if and .Values.apiKey.value (eq .Values.apiKey.value .Values.sandbox.executorKey.value) }}
{{- fail "sandbox.executorKey must be a separate, restricted key, not the controller's apiKey (L2)" }}
{{- end }}
{{- if eq (include "sandbox-controller.sandboxNamespace" .) .Release.Namespace }}
{{- fail "sandbox.namespace.name must differ from the release namespace: sandboxes get their own namespace (Pod Security restricted, NetworkPolicy, no controller secrets)" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled=true needs at least one entry in ingress.hosts" }}
{{- end }}
{{- if and (include "sandbox-controller.checkpointing" .) (not .Values.sandbox.checkpoints.enabled) }}
{{- fail "a sandbox template has suspend: checkpoint: set sandbox.checkpoints.enabled=true (the node agent that takes the checkpoints; docs/kubernetes.md, \"Suspend with memory\")" }}
{{- end }}
{{- if not .Values.sandbox.networkPolicy.dns.to }}
{{- fail "sandbox.networkPolicy.dns.to must name the DNS servers (an empty list would let DNS go anywhere)" }}
{{- end }}
{{- range .Values.sandbox.networkPolicy.dns.to }}
{{- if and .ipBlock (or (eq .ipBlock.cidr "0.0.0.0/0") (eq .ipBlock.cidr "::/0")) }}
{{- fail "sandbox.networkPolicy.dns.to: DNS goes to the cluster's DNS servers, not to every address" }}
{{- end }}
{{- end }}
{{- range .Values.sandbox.networkPolicy.egress.allow }}
{{- if or (eq .cidr "0.0.0.0/0") (eq .cidr "::/0") }}
{{- fail (printf "sandbox.networkPolicy.egress.allow: %s would reopen every address, the cluster's included; list the destinations you need (the public internet on egress.ports is already allowed)" .cidr) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Ranges the sandboxes' public egress never reaches: private (RFC 1918), shared/CGNAT (RFC 6598)
and link-local (cloud metadata) addresses, where the cluster's pods, services, nodes and API
server live, plus sandbox.networkPolicy.egress.exceptCidrs. One per line, as a YAML list.
*/}}
{{- define "sandbox-controller.sandboxPrivateRanges" -}}
{{- list "10.0.0.0/8" "172.16.0.0/12" "192.168.0.0/16" "100.64.0.0/10" "169.254.0.0/16" | toJson }}
{{- end }}

{{- define "sandbox-controller.sandboxEgressExcept" -}}
{{- $ranges := include "sandbox-controller.sandboxPrivateRanges" . | fromJsonArray }}
{{- toYaml (concat $ranges .Values.sandbox.networkPolicy.egress.exceptCidrs | uniq) }}
{{- end }}

{{/*
Pod-level and container-level security contexts of the controller's own pods.
*/}}
{{- define "sandbox-controller.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "sandbox-controller.containerSecurityContext" -}}
{{ toYaml .Values.securityContext }}
{{- end }}

{{/*
The checksum of everything the controller reads at start-up: a change rolls its pods.
*/}}
{{- define "sandbox-controller.configChecksum" -}}
{{- $files := list "configmap.yaml" "secrets.yaml" "sandbox-templates.yaml" }}
{{- $sum := "" }}
{{- range $files }}
{{- $sum = print $sum (include (print $.Template.BasePath "/" .) $) }}
{{- end }}
{{- $sum | sha256sum }}
{{- end }}

{{/*
Environment shared by receiver, worker and scheduler: the ConfigMap plus the Redis URL Secret,
and the files of an external Redis's sentinel password and TLS CA, when given.
*/}}
{{- define "sandbox-controller.commonEnv" -}}
- name: CONTROLLER_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "sandbox-controller.redisSecretName" . }}
      key: {{ .Values.redis.existingSecretKey }}
{{- if .Values.redis.sentinel.existingSecret }}
- name: CONTROLLER_REDIS_SENTINEL_PASSWORD_FILE
  value: {{ include "sandbox-controller.redisSentinelPasswordPath" . | quote }}
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: CONTROLLER_REDIS_CA_FILE
  value: {{ include "sandbox-controller.redisCaPath" . | quote }}
{{- end }}
{{- end }}

{{/*
Volumes and mounts: a writable /tmp (the root filesystem is read-only) and the sandbox templates.
*/}}
{{- define "sandbox-controller.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
- name: sandbox-templates
  configMap:
    name: {{ include "sandbox-controller.templatesConfigMapName" . }}
{{- if .Values.redis.sentinel.existingSecret }}
- name: redis-sentinel-password
  secret:
    secretName: {{ .Values.redis.sentinel.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.redis.sentinel.existingSecretKey }}
        path: {{ include "sandbox-controller.redisSentinelPasswordPath" . | base }}
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.tls.caSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.redis.tls.caKey }}
        path: {{ include "sandbox-controller.redisCaPath" . | base }}
{{- end }}
{{- end }}

{{- define "sandbox-controller.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: sandbox-templates
  mountPath: {{ include "sandbox-controller.templatesPath" . | dir }}
  readOnly: true
{{- if .Values.redis.sentinel.existingSecret }}
- name: redis-sentinel-password
  mountPath: {{ include "sandbox-controller.redisSentinelPasswordPath" . | dir }}
  readOnly: true
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  mountPath: {{ include "sandbox-controller.redisCaPath" . | dir }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "sandbox-controller.apiKeyVolume" -}}
- name: api-key
  secret:
    secretName: {{ include "sandbox-controller.apiKeySecretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.apiKey.existingSecretKey }}
        path: {{ include "sandbox-controller.apiKeyPath" . | base }}
{{- end }}

{{- define "sandbox-controller.apiKeyMount" -}}
- name: api-key
  mountPath: {{ include "sandbox-controller.apiKeyPath" . | dir }}
  readOnly: true
{{- end }}

{{/*
Codex's seccomp profile as the chart's node installer puts it on the nodes (sandbox.seccompInstaller):
its path under the kubelet's seccomp directory (what a template's seccompProfile names), the
node label the installer sets once the file is in place, and the label's value: the first 16
hex digits of the file's SHA-256, so a node with another version of the profile does not match.
*/}}
{{- define "sandbox-controller.codexSeccompProfile" -}}sandbox-controller/codex-sandbox.json{{- end }}
{{- define "sandbox-controller.codexSeccompLabel" -}}sandbox-controller/codex-sandbox-seccomp{{- end }}
{{- define "sandbox-controller.codexSeccompDigest" -}}
{{- .Files.Get "files/codex-sandbox-seccomp.json" | sha256sum | trunc 16 }}
{{- end }}

{{/*
sandbox.templates as JSON, as the controller reads them: with the node installer on
(sandbox.seccompInstaller), a template whose seccompProfile is the installed profile also selects
the nodes the installer labelled (its own nodeSelector kept beside).
*/}}
{{- define "sandbox-controller.sandboxTemplates" -}}
{{- $templates := deepCopy .Values.sandbox.templates }}
{{- if .Values.sandbox.seccompInstaller.enabled }}
{{- $profile := include "sandbox-controller.codexSeccompProfile" . }}
{{- $label := dict (include "sandbox-controller.codexSeccompLabel" .) (include "sandbox-controller.codexSeccompDigest" .) }}
{{- range $name, $template := $templates }}
{{- if eq (toString $template.seccompProfile) $profile }}
{{- $_ := set $template "nodeSelector" (merge (dict) $label ($template.nodeSelector | default dict)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $templates | toJson }}
{{- end }}

{{/*
Where the checkpoint node agent (sandbox.checkpoints) finds the node's files: each a host path
mounted at a fixed place, named in its CONTROLLER_NODE_AGENT_* setting.
*/}}
{{- define "sandbox-controller.checkpointAgentDirectory" -}}/var/lib/kubelet/checkpoints{{- end }}
{{- define "sandbox-controller.checkpointAgentContainerd" -}}/run/containerd/containerd.sock{{- end }}
{{- define "sandbox-controller.checkpointAgentCtr" -}}/usr/local/bin/ctr{{- end }}
{{- define "sandbox-controller.checkpointAgentKubeletCA" -}}/etc/kubelet-ca/kubelet.crt{{- end }}

{{/*
Whether any sandbox template checkpoints its idle sandboxes (`suspend: checkpoint`): the worker
then asks for checkpoints (a patch on pods) and records them on the workspace claims (a patch
on PVCs), and the node agent (sandbox.checkpoints) must run. "true" or "".
*/}}
{{- define "sandbox-controller.checkpointing" -}}
{{- range $name, $template := .Values.sandbox.templates }}
{{- if and (kindIs "map" $template) (eq (toString $template.suspend) "checkpoint") }}true{{ break }}{{- end }}
{{- end }}
{{- end }}

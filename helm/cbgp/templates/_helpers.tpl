{{/* Names and labels. */}}
{{- define "cbgp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cbgp.fullname" -}}
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

{{/* Name of one component's objects; the suffix keeps them under 63 characters. */}}
{{- define "cbgp.componentName" -}}
{{- printf "%s-%s" (include "cbgp.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "cbgp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cbgp.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "cbgp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cbgp.selectorLabels" . }}
app.kubernetes.io/part-of: cbgp
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{- define "cbgp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cbgp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cbgp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "cbgp.sparkImage" -}}
{{- $repo := default .Values.image.repository .Values.spark.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.spark.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Kafka security protocol, derived so that it can never disagree with sasl/tls.enabled. */}}
{{- define "cbgp.securityProtocol" -}}
{{- $k := .Values.kafka }}
{{- if and $k.sasl.enabled $k.tls.enabled }}SASL_SSL
{{- else if $k.sasl.enabled }}SASL_PLAINTEXT
{{- else if $k.tls.enabled }}SSL
{{- else }}PLAINTEXT
{{- end }}
{{- end }}

{{/* Secret holding SASL credentials and/or the CA; empty when none is needed. */}}
{{- define "cbgp.createSecret" -}}
{{- $k := .Values.kafka }}
{{- if or (and $k.sasl.enabled (not $k.sasl.existingSecret)) (and $k.tls.enabled $k.tls.ca (not $k.tls.existingSecret)) }}true{{ end }}
{{- end }}

{{- define "cbgp.saslSecretName" -}}
{{- default (printf "%s-kafka" (include "cbgp.fullname" .)) .Values.kafka.sasl.existingSecret }}
{{- end }}

{{- define "cbgp.tlsSecretName" -}}
{{- default (printf "%s-kafka" (include "cbgp.fullname" .)) .Values.kafka.tls.existingSecret }}
{{- end }}

{{- define "cbgp.tlsMountCA" -}}
{{- if and .Values.kafka.tls.enabled (or .Values.kafka.tls.existingSecret .Values.kafka.tls.ca) }}true{{ end }}
{{- end }}

{{/* Non-secret settings: the ConfigMap's data, and the topics hook Job's env (a pre-install hook
     runs before the ConfigMap exists). Keys are the services' environment variables. */}}
{{- define "cbgp.configData" -}}
CBGP_BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
CBGP_TOPIC_PREFIX: {{ .Values.kafka.topicPrefix | quote }}
CBGP_PARTITIONS: {{ .Values.kafka.partitions | quote }}
CBGP_REPLICATION_FACTOR: {{ .Values.kafka.replicationFactor | quote }}
CBGP_MIN_INSYNC_REPLICAS: {{ .Values.kafka.minInsyncReplicas | quote }}
CBGP_SECURITY_PROTOCOL: {{ include "cbgp.securityProtocol" . | quote }}
{{- if .Values.kafka.sasl.enabled }}
CBGP_SASL_MECHANISM: {{ .Values.kafka.sasl.mechanism | quote }}
{{- end }}
{{- if eq (include "cbgp.tlsMountCA" .) "true" }}
CBGP_SSL_CA_LOCATION: {{ printf "/etc/cbgp/tls/%s" .Values.kafka.tls.caKey | quote }}
{{- end }}
CBGP_METRICS_PORT: {{ .Values.metrics.port | quote }}
# The pod's address, not only loopback: Prometheus and the kubelet's probes reach the metrics port there.
CBGP_METRICS_HOST: "0.0.0.0"
{{- with .Values.serviceEndpoints }}
CBGP_SERVICE_ALLOW: {{ . | quote }}
{{- end }}
CBGP_LOG_LEVEL: {{ .Values.logLevel | quote }}
CBGP_STATE_DIR: "/var/lib/cbgp/state"
{{- range $key, $value := .Values.kafka.clientConfig }}
{{ printf "CBGP_KAFKA_%s" ($key | replace "." "_" | upper) }}: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.kafka.topicConfig }}
{{- $entries := list }}
{{- range $topic, $configs := . }}
{{- range $key, $value := $configs }}
{{- $entries = append $entries (printf "%s:%s=%s" $topic $key (ternary $value (toString (int64 $value)) (kindIs "string" $value))) }}
{{- end }}
{{- end }}
{{- if $entries }}
CBGP_TOPIC_CONFIG: {{ join ";" $entries | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* SASL credentials as env vars read from the Secret. */}}
{{- define "cbgp.secretEnv" -}}
{{- if .Values.kafka.sasl.enabled }}
- name: CBGP_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ include "cbgp.saslSecretName" . }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: CBGP_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "cbgp.saslSecretName" . }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- end }}

{{- define "cbgp.tlsVolumeMount" -}}
{{- if eq (include "cbgp.tlsMountCA" .) "true" }}
- name: kafka-ca
  mountPath: /etc/cbgp/tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "cbgp.tlsVolume" -}}
{{- if eq (include "cbgp.tlsMountCA" .) "true" }}
- name: kafka-ca
  secret:
    secretName: {{ include "cbgp.tlsSecretName" . }}
    items:
      - key: {{ .Values.kafka.tls.caKey }}
        path: {{ .Values.kafka.tls.caKey }}
{{- end }}
{{- end }}

{{/* Cross-field rules the JSON schema cannot express; failing here fails `helm install`. */}}
{{- define "cbgp.validate" -}}
{{- $p := int .Values.kafka.partitions }}
{{- $w := .Values.worker }}
{{- if $w.autoscaling.enabled }}
{{- if gt (int $w.autoscaling.maxReplicas) $p }}
{{- fail (printf "worker.autoscaling.maxReplicas (%d) must not exceed kafka.partitions (%d): extra workers would own no partition and sit idle" (int $w.autoscaling.maxReplicas) $p) }}
{{- end }}
{{- if gt (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas) }}
{{- fail (printf "worker.autoscaling.minReplicas (%d) must not exceed worker.autoscaling.maxReplicas (%d)" (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) }}
{{- end }}
{{- else if gt (int $w.replicas) $p }}
{{- fail (printf "worker.replicas (%d) must not exceed kafka.partitions (%d): extra workers would own no partition and sit idle" (int $w.replicas) $p) }}
{{- end }}
{{- if and .Values.ingest.persistence.enabled (gt (int .Values.ingest.replicas) 1) }}
{{- fail (printf "ingest.persistence.enabled gives ingest one ReadWriteOnce claim: ingest.replicas (%d) must be 0 or 1 (standby replicas restore from the snapshot in Kafka, which ingest.stateOnDisk does not write)" (int .Values.ingest.replicas)) }}
{{- end }}
{{- if lt (int .Values.kafka.replicationFactor) (int .Values.kafka.minInsyncReplicas) }}
{{- fail (printf "kafka.minInsyncReplicas (%d) must not exceed kafka.replicationFactor (%d): no produce with acks=all could ever succeed" (int .Values.kafka.minInsyncReplicas) (int .Values.kafka.replicationFactor)) }}
{{- end }}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}
{{- if or (not .Values.kafka.sasl.username) (not .Values.kafka.sasl.password) }}
{{- fail "kafka.sasl.enabled needs kafka.sasl.existingSecret, or kafka.sasl.username and kafka.sasl.password for a Secret created by the chart" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cbgp.gatewayTokens" -}}
{{- range .Values.gateway.auth.tokens }}
{{ .token }} {{ .scope }}{{ with .owner }} {{ . }}{{ end }}
{{- end }}
{{- end }}

{{/* The Secret holding the checkpoint key: the operator's, else the one the chart generates. */}}
{{- define "cbgp.checkpointSecretName" -}}
{{- .Values.checkpoints.existingSecret | default (printf "%s-checkpoints" (include "cbgp.fullname" .)) }}
{{- end }}

{{/* CBGP_CHECKPOINT_SECRET from that Secret, as an env entry. */}}
{{- define "cbgp.checkpointEnv" -}}
- name: CBGP_CHECKPOINT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "cbgp.checkpointSecretName" . }}
      key: {{ .Values.checkpoints.secretKey }}
{{- end }}

{{/* A generated secret value, kept across upgrades: the live Secret's if it exists (not when rendering offline). */}}
{{- define "cbgp.keptRandom" -}}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if and $live (index ($live.data | default dict) .key) }}
{{- index $live.data .key | b64dec }}
{{- else }}
{{- randAlphaNum 48 }}
{{- end }}
{{- end }}

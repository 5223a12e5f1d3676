{{/*
One Deployment, shared by every service and by the Spark job in deployment mode.
Arguments (dict): root, component, spec (the component's values), args (container args),
image, replicas, hpa (true: an HPA owns the replica count), recreate (one pod at a time), stateVolume,
ports (optional: container ports besides metrics), statefulSet (optional: the headless Service's name; a
StatefulSet instead, its pods named by ordinal, as gateway replicas sharing the queries need).
*/}}
{{- define "cbgp.deployment" -}}
{{- $root := .root }}
{{- $spec := .spec }}
{{- $ctx := dict "root" $root "component" .component }}
apiVersion: apps/v1
kind: {{ if .statefulSet }}StatefulSet{{ else }}Deployment{{ end }}
metadata:
  name: {{ include "cbgp.componentName" $ctx }}
  labels:
    {{- include "cbgp.labels" $ctx | nindent 4 }}
spec:
  {{- if not .hpa }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 3
  {{- if .statefulSet }}
  serviceName: {{ .statefulSet }}
  podManagementPolicy: Parallel
  {{- end }}
  selector:
    matchLabels:
      {{- include "cbgp.selectorLabels" $ctx | nindent 6 }}
  {{- if .recreate }}
  # Never two pods at once: one Spark streaming query per checkpoint.
  strategy:
    type: Recreate
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "cbgp.selectorLabels" $ctx | nindent 8 }}
      annotations:
        # Roll the pods when the settings they read at start change.
        checksum/config: {{ include "cbgp.configData" $root | sha256sum }}
        {{- with $spec.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "cbgp.serviceAccountName" $root }}
      # The services never call the Kubernetes API.
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ .image | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml (concat .args $spec.extraArgs) | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "cbgp.fullname" $root }}
          {{- $env := concat (include "cbgp.secretEnv" $root | fromYamlArray) $spec.extraEnv }}
          {{- if $env }}
          env:
            {{- toYaml $env | nindent 12 }}
          {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
              protocol: TCP
            {{- with .ports }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          # /healthz: the process is alive. /readyz: 503 while restoring state or without a broker.
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 10
            periodSeconds: 15
            timeoutSeconds: 3
            failureThreshold: 4
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 3
          resources:
            {{- toYaml $spec.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: state
              mountPath: /var/lib/cbgp/state
            {{- with include "cbgp.tlsVolumeMount" $root | trim }}{{ . | nindent 12 }}{{- end }}
            {{- with .extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        # readOnlyRootFilesystem: the only writable paths are these volumes.
        - name: tmp
          emptyDir:
            sizeLimit: {{ $root.Values.tmpSizeLimit }}
        - name: state
          {{- toYaml .stateVolume | nindent 10 }}
        {{- with include "cbgp.tlsVolume" $root | trim }}{{ . | nindent 8 }}{{- end }}
        {{- with .extraVolumes }}
        {{- toYaml . | nindent 8 }}
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
{{- end }}

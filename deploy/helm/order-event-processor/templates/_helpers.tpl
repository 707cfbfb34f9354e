{{/*
Names and labels.
*/}}
{{- define "oep.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "oep.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "oep.labels" -}}
{{ include "oep.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "oep.workerLabels" -}}
{{ include "oep.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "oep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "oep.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "oep.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
A value of `config` as the string the worker reads. Helm reads a YAML number as a float64, which
would print 67108864 as 6.7108864e+07: a whole number prints as one.
*/}}
{{- define "oep.str" -}}
{{- if kindIs "float64" . -}}
{{- if eq (floor .) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/*
The worker's own defaults of the settings the chart computes from (app/settings/; the test
tests/unit/test_helm_chart.py holds each to the product's), and the product's constants:
READINESS_CHECK_SECONDS is app/web/health.py's bound on each of /readyz's two checks.
*/}}
{{- define "oep.productDefaults" -}}
APP_ID: order-event-processor
KAFKA_BROKER: kafka://127.0.0.1:9092
KAFKA_SECURITY_PROTOCOL: PLAINTEXT
KAFKA_SASL_MECHANISM: SCRAM-SHA-512
ORDER_EVENT_TOPIC: order-event
ORDER_EVENT_PARTITIONS: "8"
BROKER_SESSION_TIMEOUT_SECONDS: "30"
KAFKA_REVOKE_GRACE_SECONDS: "10"
KAFKA_STARTUP_WAIT_SECONDS: "300"
INFRA_RETRY_BUDGET_SECONDS: "60"
MAX_BATCH_BYTES: "67108864"
BREAKER_HOLD_RECORDS: "10000"
WEB_PORT: "6066"
READINESS_CHECK_SECONDS: "10"
{{- end -}}

{{/* A setting's value: `config`'s, else the worker's default (call with (list $ "NAME")). */}}
{{- define "oep.setting" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $defaults := include "oep.productDefaults" $root | fromYaml -}}
{{- $value := index $root.Values.config $name -}}
{{- if or (eq $value nil) (eq (include "oep.str" $value) "") -}}
{{- index $defaults $name -}}
{{- else -}}
{{- include "oep.str" $value -}}
{{- end -}}
{{- end -}}

{{/*
Every number the chart derives from the worker's settings, in one place (docs/deploying-kubernetes.md,
"The numbers and where they come from"). Read with: include "oep.numbers" . | fromYaml
*/}}
{{- define "oep.numbers" -}}
{{- $session := include "oep.setting" (list . "BROKER_SESSION_TIMEOUT_SECONDS") | float64 -}}
{{- $stop := $session -}}
{{- with .Values.config.STOP_TIMEOUT_SECONDS }}{{ $stop = include "oep.str" . | float64 }}{{ end -}}
{{- $stall := $session -}}
{{- with .Values.config.WATCHDOG_STALL_SECONDS }}{{ $stall = include "oep.str" . | float64 }}{{ end -}}
{{- $rejoin := divf $session 3 -}}
{{- with .Values.config.WATCHDOG_REJOIN_GRACE_SECONDS }}{{ $rejoin = include "oep.str" . | float64 }}{{ end -}}
{{- $infra := include "oep.setting" (list . "INFRA_RETRY_BUDGET_SECONDS") | float64 -}}
{{- $startupWait := include "oep.setting" (list . "KAFKA_STARTUP_WAIT_SECONDS") | float64 -}}
{{- $revoke := include "oep.setting" (list . "KAFKA_REVOKE_GRACE_SECONDS") | float64 -}}
{{- $partitions := include "oep.setting" (list . "ORDER_EVENT_PARTITIONS") | float64 | int -}}
{{- $readyzCheck := index (include "oep.productDefaults" . | fromYaml) "READINESS_CHECK_SECONDS" | float64 -}}
{{- $period := .Values.probes.periodSeconds | int -}}
{{- /* SIGTERM -> the worker's own bound (STOP_TIMEOUT_SECONDS, default the session timeout) -> exit 70; the
       margin lets that exit, its log line and the kubelet's bookkeeping land before SIGKILL. */ -}}
stopSeconds: {{ ceil $stop | int }}
terminationGracePeriodSeconds: {{ add (ceil $stop | int) (.Values.probes.graceMarginSeconds | int) }}
{{- /* Liveness (/health: the event loop answers) must outlast what a worker rides out by design without
       the loop answering late: it never should, but a kill must never beat the product's own bounds: the
       database's budget and the watchdog's stall + rejoin grace (after which the worker exits by itself). */}}
livenessWindowSeconds: {{ maxf $infra (addf $stall $rejoin) | ceil | int }}
livenessFailureThreshold: {{ add1 (divf (maxf $infra (addf $stall $rejoin)) $period | ceil | int) }}
{{- /* /health answers only once the start-up checks are done: the broker waited for (KAFKA_STARTUP_WAIT_SECONDS),
       the topics' replication read (up to as long again), the database waited for (INFRA_RETRY_BUDGET_SECONDS),
       after the interpreter's start (30 s; measured 5.7 s on a busy 2-core machine). The worker exits 69 by
       itself after those; the startup probe must not end it first. */}}
{{- $startup := addf (mulf 2 $startupWait) $infra 30 }}
startupWindowSeconds: {{ $startup | ceil | int }}
startupFailureThreshold: {{ add1 (divf $startup $period | ceil | int) }}
{{- /* /readyz runs two checks of READINESS_CHECK_SECONDS each, one after the other. */}}
readinessTimeoutSeconds: {{ add (mulf 2 $readyzCheck | ceil | int) 2 }}
partitions: {{ $partitions }}
revokeGraceSeconds: {{ ceil $revoke | int }}
{{- /* The worst a worker's leaving costs the group: its stop bound, then (when it could not leave cleanly) its
       session's expiry, then the revoke grace every member waits for its records in flight. */}}
rebalanceWorstSeconds: {{ addf $stop $session $revoke | ceil | int }}
{{- /* A new worker counts as available once its join's rebalance is over: the revoke grace, and a join
       (measured: 0.2 s) with room. */}}
minReadySeconds: {{ add (ceil $revoke | int) 5 }}
{{- end -}}

{{/*
Refuse what must never be: a secret's value in `config`, a setting the chart owns, more workers
than partitions. The messages name the setting, never its value.
*/}}
{{- define "oep.validate" -}}
{{- $secretNames := list "IDEM_TOKEN_SECRET" "MYSQL_URL" "KAFKA_SASL_PASSWORD" "WEB_TOKEN" "WEB_READ_TOKEN" -}}
{{- range $name, $value := .Values.config -}}
{{- if or (has (upper $name) $secretNames) (regexMatch "(?i)(SECRET|PASSWORD|_TOKEN)$" $name) -}}
{{- fail (printf "config.%s is a secret: put it in a Secret and name it in secretEnv.%s ({secret: <name>, key: <key>}); the chart never holds a secret's value" $name $name) -}}
{{- end -}}
{{- if or (kindIs "map" $value) (kindIs "slice" $value) -}}
{{- fail (printf "config.%s: a setting is a string" $name) -}}
{{- end -}}
{{- end -}}
{{- range $name := list "WEB_BIND" "WEB_TOKENS_FILE" "DATA_DIR" -}}
{{- if has $name (keys $.Values.config | sortAlpha | join "," | upper | splitList ",") -}}
{{- fail (printf "config.%s is set by the chart (see values.yaml): leave it out" $name) -}}
{{- end -}}
{{- end -}}
{{- range $name, $ref := .Values.secretEnv -}}
{{- if not (kindIs "map" $ref) -}}
{{- fail (printf "secretEnv.%s must name a Secret's key ({secret: <name>, key: <key>}), never hold the value" $name) -}}
{{- end -}}
{{- if not $ref.key -}}
{{- fail (printf "secretEnv.%s names no key" $name) -}}
{{- end -}}
{{- if not (or $ref.secret $.Values.existingSecret) -}}
{{- fail (printf "secretEnv.%s names no secret, and existingSecret is empty" $name) -}}
{{- end -}}
{{- if hasKey $.Values.config $name -}}
{{- fail (printf "%s is in both config and secretEnv: keep one" $name) -}}
{{- end -}}
{{- end -}}
{{- range $name := list "IDEM_TOKEN_SECRET" "MYSQL_URL" -}}
{{- if not (hasKey $.Values.secretEnv $name) -}}
{{- fail (printf "secretEnv.%s is required (a Secret's key: docs/deploying-kubernetes.md)" $name) -}}
{{- end -}}
{{- end -}}
{{- $n := include "oep.numbers" . | fromYaml -}}
{{- if gt (.Values.replicaCount | int) ($n.partitions | int) -}}
{{- fail (printf "replicaCount %d is more than ORDER_EVENT_PARTITIONS %d: a worker beyond the partitions gets none" (.Values.replicaCount | int) ($n.partitions | int)) -}}
{{- end -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled -}}
{{- fail "autoscaling: keda or hpa, not both (two autoscalers would fight over the replicas)" -}}
{{- end -}}
{{- if lt (.Values.autoscaling.minReplicas | int) 1 -}}
{{- fail "autoscaling.minReplicas must be at least 1: dead-letter drains and bulk jobs run in the workers, whatever the lag" -}}
{{- end -}}
{{- if gt (.Values.autoscaling.maxReplicas | int) ($n.partitions | int) -}}
{{- fail (printf "autoscaling.maxReplicas %d is more than ORDER_EVENT_PARTITIONS %d" (.Values.autoscaling.maxReplicas | int) ($n.partitions | int)) -}}
{{- end -}}
{{- end -}}

{{/* The most workers the autoscaler may run: autoscaling.maxReplicas, or the partitions. */}}
{{- define "oep.maxReplicas" -}}
{{- $n := include "oep.numbers" . | fromYaml -}}
{{- $max := .Values.autoscaling.maxReplicas | int -}}
{{- if or (eq $max 0) (gt $max ($n.partitions | int)) -}}{{ $n.partitions }}{{- else -}}{{ $max }}{{- end -}}
{{- end -}}

{{- define "oep.autoscaling" -}}
{{- if or .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled -}}true{{- end -}}
{{- end -}}

{{/*
The worker's environment, for the Deployment and the migration Job alike: the ConfigMap, then
each secret by reference.
*/}}
{{- define "oep.envFrom" -}}
- configMapRef:
    name: {{ include "oep.fullname" . }}
{{- end -}}

{{- define "oep.secretEnv" -}}
{{- range $name, $ref := .Values.secretEnv }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ default $.Values.existingSecret $ref.secret }}
      key: {{ $ref.key }}
{{- end }}
{{- if .Values.webTokensFile.secret }}
- name: WEB_TOKENS_FILE
  value: /etc/order-event-processor/web-tokens/{{ .Values.webTokensFile.key }}
{{- end }}
{{- end -}}

{{- define "oep.fileMounts" -}}
{{- range .Values.fileMounts }}
- name: {{ .name }}
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "oep.fileVolumes" -}}
{{- range .Values.fileMounts }}
- name: {{ .name }}
  {{- if .secret }}
  secret:
    secretName: {{ .secret }}
  {{- else if .configMap }}
  configMap:
    name: {{ .configMap }}
  {{- else }}
  {{- fail (printf "fileMounts %s: name a secret or a configMap" .name) }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "oep.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "oep.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
The settings as the worker reads them: `config`, and what the chart sets itself. The ConfigMap's
data, and the migration Job's env (a pre-install hook runs before the ConfigMap exists).
*/}}
{{- define "oep.configData" -}}
{{- $svc := include "oep.fullname" . -}}
{{- $hosts := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) -}}
{{- with .Values.config.WEB_ALLOWED_HOSTS }}{{ $hosts = concat (splitList "," (include "oep.str" .)) $hosts }}{{ end -}}
{{- range $name, $value := .Values.config }}
{{- if ne $name "WEB_ALLOWED_HOSTS" }}
{{ $name }}: {{ include "oep.str" $value | quote }}
{{- end }}
{{- end }}
# The pod's network: the NetworkPolicy decides who reaches the port.
WEB_BIND: "0.0.0.0"
# The Service's names besides the worker's own (a Host other than these answers 421).
WEB_ALLOWED_HOSTS: {{ $hosts | join "," | quote }}
# Faust's working folder, on an emptyDir (the root filesystem is read-only).
DATA_DIR: /var/lib/order-event-processor
{{- end -}}

{{/*
KEDA's Kafka trigger, from the settings the workers connect with: the brokers of KAFKA_BROKER
(no scheme, comma-separated), the group (APP_ID), the topic, TLS and SASL as
KAFKA_SECURITY_PROTOCOL and KAFKA_SASL_MECHANISM say.
*/}}
{{- define "oep.kafkaScaler" -}}
{{- $servers := list -}}
{{- range splitList ";" (replace "," ";" (include "oep.setting" (list . "KAFKA_BROKER"))) -}}
{{- with trim . }}{{ $servers = append $servers (regexReplaceAll "^[A-Za-z]+://" . "") }}{{ end -}}
{{- end -}}
{{- $protocol := include "oep.setting" (list . "KAFKA_SECURITY_PROTOCOL") | upper -}}
{{- $mechanism := include "oep.setting" (list . "KAFKA_SASL_MECHANISM") | upper -}}
{{- $sasl := "none" -}}
{{- if hasPrefix "SASL_" $protocol -}}
{{- $sasl = get (dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512") $mechanism -}}
{{- end -}}
bootstrapServers: {{ join "," $servers | quote }}
consumerGroup: {{ include "oep.setting" (list . "APP_ID") | quote }}
topic: {{ include "oep.setting" (list . "ORDER_EVENT_TOPIC") | quote }}
tls: {{ ternary "enable" "disable" (has $protocol (list "SSL" "SASL_SSL")) }}
sasl: {{ $sasl }}
authenticated: {{ or (ne $sasl "none") (not (empty .Values.autoscaling.kafkaCA)) }}
{{- end -}}

{{/*
The autoscaler's pace (docs/deploying-kubernetes.md, "Autoscaling"): a worker added or removed
costs the whole group a rebalance, so the steps are a worst rebalance apart and the lag a worker is
given is worth that pause.
*/}}
{{- define "oep.scalePace" -}}
{{- $n := include "oep.numbers" . | fromYaml -}}
lagThreshold: {{ mul (.Values.autoscaling.eventsPerSecondPerWorker | int) 3 ($n.revokeGraceSeconds | int) }}
stepSeconds: {{ $n.rebalanceWorstSeconds }}
downWindowSeconds: {{ max 300 (mul 2 ($n.rebalanceWorstSeconds | int)) }}
{{- end -}}

{{- define "oep.scaleBehavior" -}}
{{- $scale := include "oep.scalePace" . | fromYaml -}}
# Down one worker at a time, a worst rebalance apart, after the lag stayed low for the window.
scaleDown:
  stabilizationWindowSeconds: {{ $scale.downWindowSeconds }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: 1
      periodSeconds: {{ $scale.stepSeconds }}
# Up at once, at most doubling per step: workers that join together cost one rebalance.
scaleUp:
  stabilizationWindowSeconds: 0
  selectPolicy: Max
  policies:
    - type: Percent
      value: 100
      periodSeconds: {{ $scale.stepSeconds }}
{{- end -}}

{{/*
The workers up now, while a dead-letter drain ran rows in the last 5 minutes or a worker runs a
bulk job; nothing otherwise. As a target of 1 per worker it holds the count while they work.
*/}}
{{- define "oep.holdQuery" -}}
{{- $m := printf "job=%q,namespace=%q" .Values.metrics.job .Release.Namespace -}}
{{- printf "count(up{%s} == 1) and on() ((max(order_bulk_job_running{%s}) > 0) or (sum(increase(order_compensations_total{%s,result=\"due_run\"}[5m])) > 0))" $m $m $m -}}
{{- end -}}

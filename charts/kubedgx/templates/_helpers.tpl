{{/* Names: the usual Helm conventions, cut to 63 characters (DNS labels). */}}
{{- define "kubedgx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubedgx.fullname" -}}
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

{{/* <fullname>-<suffix>, still at most 63 characters. */}}
{{- define "kubedgx.component" -}}
{{- printf "%s-%s" (include "kubedgx.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix }}
{{- end }}

{{- define "kubedgx.operatorName" -}}
{{- include "kubedgx.component" (dict "root" . "suffix" "operator") }}
{{- end }}

{{- define "kubedgx.webhookName" -}}
{{- include "kubedgx.component" (dict "root" . "suffix" "webhook") }}
{{- end }}

{{- define "kubedgx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubedgx.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kubedgx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubedgx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubedgx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kubedgx.labels" -}}
helm.sh/chart: {{ include "kubedgx.chart" . }}
{{ include "kubedgx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubedgx
{{- end }}

{{/* An image reference from {repository, tag, digest}: repository:tag, or repository:tag@digest. */}}
{{- define "kubedgx.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" .image.repository $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{- define "kubedgx.trainerImage" -}}
{{- include "kubedgx.image" (dict "root" . "image" .Values.trainer.image) }}
{{- end }}

{{- define "kubedgx.dataSyncImage" -}}
{{- if .Values.dataSync.image.repository }}
{{- include "kubedgx.image" (dict "root" . "image" .Values.dataSync.image) }}
{{- else }}
{{- include "kubedgx.trainerImage" . }}
{{- end }}
{{- end }}

{{/* Webhook objects. */}}
{{- define "kubedgx.webhookServiceName" -}}
{{- include "kubedgx.webhookName" . }}
{{- end }}

{{- define "kubedgx.webhookConfigurationName" -}}
{{- include "kubedgx.webhookName" . }}
{{- end }}

{{- define "kubedgx.certificateName" -}}
{{- include "kubedgx.webhookName" . }}
{{- end }}

{{/* The Lease the replicas elect their leader on. */}}
{{- define "kubedgx.leaseName" -}}
{{- include "kubedgx.component" (dict "root" . "suffix" "leader") }}
{{- end }}

{{- define "kubedgx.certificateSecretName" -}}
{{- include "kubedgx.component" (dict "root" . "suffix" "webhook-tls") }}
{{- end }}

{{/* The operator signs its own webhook certificate and manages the configuration (the default mode). */}}
{{- define "kubedgx.selfSignedWebhook" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}true{{ end }}
{{- end }}

{{/* KUBEDGX_PRIORITY_CLASSES: low=...,normal=...,high=... (empty: workers carry no priorityClassName). */}}
{{- define "kubedgx.priorityClassMap" -}}
{{- if .Values.priorityClasses.enabled }}
{{- $p := .Values.priorityClasses }}
{{- printf "low=%s,normal=%s,high=%s" $p.low.name $p.normal.name $p.high.name }}
{{- end }}
{{- end }}

{{/* The catalog as the operator reads it: values' catalog, plus catalogExtraGpus. */}}
{{- define "kubedgx.catalog" -}}
{{- $catalog := deepCopy .Values.catalog }}
{{- $_ := set $catalog "gpus" (concat (.Values.catalog.gpus | default list) .Values.catalogExtraGpus) }}
{{- toYaml $catalog }}
{{- end }}

{{/* The labels that select the operator's pods (Deployment, Services, PDB, NetworkPolicy, PodMonitor). */}}
{{- define "kubedgx.operatorSelectorLabels" -}}
{{ include "kubedgx.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The private CAs of object stores (caBundle): "true" when given, as PEM or as a ConfigMap. */}}
{{- define "kubedgx.caBundle" -}}
{{- if and .Values.caBundle.pem .Values.caBundle.configMap.name }}
{{- fail "caBundle: give the PEM (caBundle.pem) or an existing ConfigMap (caBundle.configMap.name), not both" }}
{{- end }}
{{- if or .Values.caBundle.pem .Values.caBundle.configMap.name }}true{{ end }}
{{- end }}

{{- define "kubedgx.caBundleConfigMapName" -}}
{{- .Values.caBundle.configMap.name | default (include "kubedgx.component" (dict "root" . "suffix" "ca-bundle")) }}
{{- end }}

{{/* Where `helm test` dry-runs its jobs: tests.namespace, else the first watched namespace, else the release's. */}}
{{- define "kubedgx.testNamespace" -}}
{{- .Values.tests.namespace | default (first (.Values.watchNamespaces | default (list .Release.Namespace))) }}
{{- end }}

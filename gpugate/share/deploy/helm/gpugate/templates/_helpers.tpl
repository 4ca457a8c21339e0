{{/* The labels every object carries, and those that select the gated pods and the router. */}}
{{- define "gpugate.labels" -}}
app.kubernetes.io/name: gpugate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpugate.gateSelector" -}}
app.kubernetes.io/name: gpugate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gate
{{- end }}

{{- define "gpugate.routerSelector" -}}
app.kubernetes.io/name: gpugate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{- define "gpugate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}


{{/* A model's backend in the router: m_ and its name, what HAProxy names cannot hold
     replaced (as tests/scaleout/haproxy.py names it). */}}
{{- define "gpugate.backend" -}}
{{ .runtime }}_m_{{ regexReplaceAll "[^A-Za-z0-9_.-]" .model "_" }}
{{- end }}

{{/* The SRV name under which the headless Service publishes a runtime's port of every
     ready gated pod. */}}
{{- define "gpugate.srv" -}}
_{{ .name }}._tcp.{{ .root.Release.Name }}-gates.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}
{{- end }}

{{/* The probe: kubelet's httpGet cannot present a token from a Secret, so a few lines of
     Python in the gate's container ask /gate/v1/health with read.token.
       live:  the gate answered at all (200 or 503): its event loop is running.
       ready: the gate can admit (started, NVML fresh on every GPU). */}}
{{- define "gpugate.probe" -}}
import json, sys, urllib.error, urllib.request
URL = "http://127.0.0.1:{{ .Values.gate.controlPort }}/gate/v1/health"
TOKEN = "/etc/gpugate/tokens/read.token"
with open(TOKEN, encoding="utf-8") as f:
    token = f.readline().strip()
ask = urllib.request.Request(URL, headers={"Authorization": "Bearer " + token})
try:
    with urllib.request.urlopen(ask, timeout=3) as answer:
        body = answer.read()
except urllib.error.HTTPError as answer:
    if answer.code != 503:
        sys.exit(f"{URL}: HTTP {answer.code}")
    body = answer.read()
if sys.argv[1] == "live":
    sys.exit(0)
checks = json.loads(body)["checks"]
failed = [c for c in checks if c["check"] in ("started", "nvml") and not c["ok"]]
sys.exit(f"not ready: {json.dumps(failed)}" if failed else 0)
{{- end }}

{{/* The runtimes routed by model, through the router. */}}
{{- define "gpugate.routed" -}}
{{- range $name, $runtime := .Values.runtimes }}{{ if and $runtime.enabled (eq $runtime.routing "model") }}{{ $name }} {{ end }}{{ end }}
{{- end }}

package main

// Whether Ollama v0.24.0 would reach the scheduler (and so could load a
// model) for one request, following server/routes.go and the middlewares in
// the order the router runs them.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"slices"
	"strings"
)

type verdict struct {
	CouldLoad bool
	Model     string
	Reason    string
	Undecided bool
	// What a request that could load asks of the load: its keep_alive in
	// nanoseconds (nil: none given) and the runner options it sets.
	KeepAlive *int64
	Runner    map[string]any
	// AfterLoad is the 500 Ollama answers once the model is loaded, when the
	// request is refused only then (a format or template it cannot use).
	AfterLoad string
}

func refuse(reason string) verdict { return verdict{Reason: reason} }

type judge struct {
	catalog *catalog
	cors    *corsRules
	// bindLoopback: Ollama checks the Host header only when it listens on a
	// loopback address (server/routes.go allowedHostsMiddleware).
	bindLoopback bool
}

func newJudge(c *catalog, bind string) *judge {
	j := &judge{catalog: c, cors: newCorsRules(ollamaOrigins()), bindLoopback: true}
	if ap, err := netip.ParseAddrPort(bind); err == nil && !ap.Addr().IsLoopback() {
		j.bindLoopback = false
	}
	return j
}

var inferenceRoutes = map[string]bool{
	"/api/generate": true, "/api/chat": true, "/api/embed": true, "/api/embeddings": true,
	"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true,
	"/v1/responses": true, "/v1/messages": true, "/v1/audio/transcriptions": true,
}

func (j *judge) judge(r *http.Request, body []byte) verdict {
	// Ollama serves its gin engine through http.DefaultServeMux under "/"
	// (server/routes.go Serve); net/http's ServeMux.findHandler redirects any
	// non-CONNECT request whose escaped path cleanPath would change.
	if escaped := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(escaped) != escaped {
		return refuse("redirect: path not clean")
	}
	// gin matches the decoded path exactly (no RedirectFixedPath, no raw path).
	if !inferenceRoutes[r.URL.Path] {
		return refuse("route")
	}
	if reason := j.cors.check(r); reason != "" {
		return refuse(reason)
	}
	if j.bindLoopback && !hostAllowed(r.Host) {
		return refuse("host")
	}
	if r.Method != http.MethodPost {
		return refuse("method")
	}
	switch r.URL.Path {
	case "/api/generate":
		var req GenerateRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		return j.generate(req)
	case "/api/chat":
		var req ChatRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		return j.chat(req, false)
	case "/api/embed":
		var req EmbedRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		return j.embed(req)
	case "/api/embeddings":
		var req EmbeddingRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		return j.embeddings(req)
	case "/v1/audio/transcriptions":
		return j.transcription(r, body)
	}
	return j.v1(r, body)
}

// cleanPath is net/http server.go cleanPath.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		if len(p) == len(np)+1 && strings.HasPrefix(p, np) {
			np = p
		} else {
			np += "/"
		}
	}
	return np
}

// bindJSON is gin's ShouldBindJSON as Ollama uses it: one json.Decoder.Decode
// of the body (trailing bytes ignored, unknown fields ignored), with io.EOF
// reported as the handlers report it.
func bindJSON(body []byte, v any) error {
	err := json.NewDecoder(bytes.NewReader(body)).Decode(v)
	if errors.Is(err, io.EOF) {
		return errors.New("missing request body")
	}
	return err
}

// handoff is what each /v1 middleware does after converting: encode the api
// request as the new body, which the handler then binds again.
func handoff(converted, out any) error {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(converted); err != nil {
		return err
	}
	return bindJSON(b.Bytes(), out)
}

func (j *judge) v1(r *http.Request, body []byte) verdict {
	// server/cloud_proxy.go cloudPassthroughMiddleware inflates zstd bodies;
	// the standard library has no zstd decoder.
	if r.Header.Get("Content-Encoding") == "zstd" {
		return verdict{Reason: "zstd: body not decoded", Undecided: true}
	}
	if model, ok := extractModelField(body); ok {
		if ref, err := parseAndValidateModelRef(model); err == nil && ref.Source == sourceCloud {
			return verdict{Reason: "cloud", Model: ref.Name.DisplayShortest()}
		}
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		// middleware/openai.go ChatMiddleware
		var req oaChatCompletionRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		if len(req.Messages) == 0 {
			return refuse("messages: empty")
		}
		converted, err := fromChatRequest(req)
		if err != nil {
			return refuse("convert: " + err.Error())
		}
		var chat ChatRequest
		if err := handoff(converted, &chat); err != nil {
			return refuse("handoff: " + err.Error())
		}
		return j.chat(chat, false)
	case "/v1/completions":
		// middleware/openai.go CompletionsMiddleware
		var req oaCompletionRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		converted, err := fromCompleteRequest(req)
		if err != nil {
			return refuse("convert: " + err.Error())
		}
		var gen GenerateRequest
		if err := handoff(converted, &gen); err != nil {
			return refuse("handoff: " + err.Error())
		}
		return j.generate(gen)
	case "/v1/embeddings":
		// middleware/openai.go EmbeddingsMiddleware
		var req oaEmbedRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		if req.EncodingFormat != "" && !strings.EqualFold(req.EncodingFormat, "float") && !strings.EqualFold(req.EncodingFormat, "base64") {
			return refuse("encoding_format")
		}
		if req.Input == "" {
			req.Input = []string{""}
		}
		if req.Input == nil {
			return refuse("input: missing")
		}
		if v, ok := req.Input.([]any); ok && len(v) == 0 {
			return refuse("input: empty")
		}
		var embed EmbedRequest
		if err := handoff(EmbedRequest{Model: req.Model, Input: req.Input, Dimensions: req.Dimensions}, &embed); err != nil {
			return refuse("handoff: " + err.Error())
		}
		return j.embed(embed)
	case "/v1/responses":
		// middleware/openai.go ResponsesMiddleware
		var req rsRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		converted, err := fromResponsesRequest(req)
		if err != nil {
			return refuse("convert: " + err.Error())
		}
		stream := req.Stream != nil && *req.Stream
		converted.Stream = &stream
		var chat ChatRequest
		if err := handoff(converted, &chat); err != nil {
			return refuse("handoff: " + err.Error())
		}
		return j.chat(chat, false)
	default:
		// middleware/anthropic.go AnthropicMessagesMiddleware
		var req anMessagesRequest
		if err := bindJSON(body, &req); err != nil {
			return refuse("decode: " + err.Error())
		}
		if req.Model == "" {
			return refuse("name: model is required")
		}
		if req.MaxTokens <= 0 {
			return refuse("max_tokens")
		}
		if len(req.Messages) == 0 {
			return refuse("messages: empty")
		}
		converted, err := fromMessagesRequest(req)
		if err != nil {
			return refuse("convert: " + err.Error())
		}
		var chat ChatRequest
		if err := handoff(converted, &chat); err != nil {
			return refuse("handoff: " + err.Error())
		}
		return j.chat(chat, true)
	}
}

// extractModelField is server/cloud_proxy.go extractModelField: a strict
// whole-body decode where only the exact key "model" counts.
func extractModelField(body []byte) (string, bool) {
	if len(body) == 0 {
		return "", false
	}
	var payload map[string]json.RawMessage
	if err := json.Unmarshal(body, &payload); err != nil {
		return "", false
	}
	raw, ok := payload["model"]
	if !ok {
		return "", false
	}
	var model string
	if err := json.Unmarshal(raw, &model); err != nil {
		return "", false
	}
	model = strings.TrimSpace(model)
	return model, model != ""
}

// transcription is middleware/openai.go TranscriptionMiddleware: the model
// comes from FormValue, where the URL query is consulted before the form.
func (j *judge) transcription(r *http.Request, body []byte) verdict {
	req := r.Clone(r.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.Form, req.PostForm, req.MultipartForm = nil, nil, nil
	if err := req.ParseMultipartForm(25 << 20); err != nil {
		return refuse("multipart: " + err.Error())
	}
	defer func() {
		if req.MultipartForm != nil {
			_ = req.MultipartForm.RemoveAll()
		}
	}()
	model := req.FormValue("model")
	if model == "" {
		return refuse("name: model is required")
	}
	file, _, err := req.FormFile("file")
	if err != nil {
		return verdict{Model: model, Reason: "file: " + err.Error()}
	}
	audio, err := io.ReadAll(file)
	_ = file.Close()
	if err != nil {
		return verdict{Model: model, Reason: "file: " + err.Error()}
	}
	if len(audio) == 0 {
		return verdict{Model: model, Reason: "file: empty"}
	}
	stream := true
	converted := ChatRequest{
		Model: model,
		Messages: []Message{
			{Role: "system", Content: "Transcribe the following audio exactly as spoken."},
			{Role: "user", Content: "Transcribe this audio.", Images: []ImageData{audio}},
		},
		Stream:  &stream,
		Options: map[string]any{"temperature": 0},
	}
	var chat ChatRequest
	if err := handoff(converted, &chat); err != nil {
		return refuse("handoff: " + err.Error())
	}
	return j.chat(chat, false)
}

// resolve is the common head of the handlers: parseAndValidateModelRef, the
// cloud proxy, then the manifest lookup (getExistingName folds case for
// generate, chat and embed; embeddings looks the name up as given).
func (j *judge) resolve(raw string, fold bool) (modelRef, installed, *verdict) {
	ref, err := parseAndValidateModelRef(raw)
	if err != nil {
		return ref, installed{}, &verdict{Model: raw, Reason: "name: " + err.Error()}
	}
	if ref.Source == sourceCloud {
		return ref, installed{}, &verdict{Model: ref.Name.DisplayShortest(), Reason: "cloud"}
	}
	m, ok := j.catalog.find(ref.Name, fold)
	if !ok {
		return ref, installed{}, &verdict{Model: ref.Name.DisplayShortest(), Reason: "not found"}
	}
	return ref, m, nil
}

func topLogprobsBad(n int) bool { return n < 0 || n > 20 }

// generate is server/routes.go GenerateHandler up to scheduleRunner.
func (j *judge) generate(req GenerateRequest) verdict {
	if topLogprobsBad(req.TopLogprobs) {
		return verdict{Model: req.Model, Reason: "top_logprobs"}
	}
	ref, m, v := j.resolve(req.Model, true)
	if v != nil {
		return *v
	}
	model := m.name.DisplayShortest()
	if m.remote {
		if ref.Source == sourceLocal {
			return verdict{Model: model, Reason: "not found"}
		}
		return verdict{Model: model, Reason: "remote"}
	}
	if req.Prompt == "" && req.KeepAlive != nil && req.KeepAlive.Duration == 0 {
		return verdict{Model: model, Reason: "unload"}
	}
	if slices.Contains(m.caps, "image") {
		return j.schedule(m, []string{"image"}, nil)
	}
	if req.Raw && (req.Template != "" || req.System != "" || len(req.Context) > 0) {
		return verdict{Model: model, Reason: "raw"}
	}
	caps := []string{"completion"}
	if req.Suffix != "" {
		caps = append(caps, "insert")
	}
	if slices.Contains(m.caps, "thinking") {
		caps = append(caps, "thinking")
	} else if req.Think != nil && req.Think.Bool() {
		return verdict{Model: model, Reason: "think: unsupported"}
	}
	scheduled := j.schedule(m, caps, req.Options)
	scheduled.KeepAlive = nanoseconds(req.KeepAlive)
	if scheduled.CouldLoad && req.Prompt != "" {
		scheduled.AfterLoad = generateAfterLoad(req)
	}
	return scheduled
}

// chat is server/routes.go ChatHandler up to scheduleRunner; relaxThinking is
// the "relax_thinking" key the Anthropic middleware sets.
func (j *judge) chat(req ChatRequest, relaxThinking bool) verdict {
	if topLogprobsBad(req.TopLogprobs) {
		return verdict{Model: req.Model, Reason: "top_logprobs"}
	}
	ref, m, v := j.resolve(req.Model, true)
	if v != nil {
		return *v
	}
	model := m.name.DisplayShortest()
	if ref.Source == sourceLocal && m.remote {
		return verdict{Model: model, Reason: "not found"}
	}
	if len(req.Messages) == 0 && req.KeepAlive != nil && req.KeepAlive.Duration == 0 {
		return verdict{Model: model, Reason: "unload"}
	}
	if m.remote {
		return verdict{Model: model, Reason: "remote"}
	}
	caps := []string{"completion"}
	if len(req.Tools) > 0 {
		caps = append(caps, "tools")
	}
	if slices.Contains(m.caps, "thinking") {
		caps = append(caps, "thinking")
	} else if req.Think != nil && req.Think.Bool() && !relaxThinking {
		return verdict{Model: model, Reason: "think: unsupported"}
	}
	scheduled := j.schedule(m, caps, req.Options)
	scheduled.KeepAlive = nanoseconds(req.KeepAlive)
	if scheduled.CouldLoad && len(req.Messages) > 0 {
		scheduled.AfterLoad = formatRefusal(req.Format)
	}
	return scheduled
}

// embed is server/routes.go EmbedHandler up to scheduleRunner.
func (j *judge) embed(req EmbedRequest) verdict {
	ref, err := parseAndValidateModelRef(req.Model)
	if err != nil {
		return verdict{Model: req.Model, Reason: "name: " + err.Error()}
	}
	if ref.Source == sourceCloud {
		return verdict{Model: ref.Name.DisplayShortest(), Reason: "cloud"}
	}
	switch i := req.Input.(type) {
	case string:
	case []any:
		for _, v := range i {
			if _, ok := v.(string); !ok {
				return verdict{Model: ref.Name.DisplayShortest(), Reason: "input: invalid type"}
			}
		}
	default:
		if req.Input != nil {
			return verdict{Model: ref.Name.DisplayShortest(), Reason: "input: invalid type"}
		}
	}
	_, m, v := j.resolve(req.Model, true)
	if v != nil {
		return *v
	}
	scheduled := j.schedule(m, nil, req.Options)
	scheduled.KeepAlive = nanoseconds(req.KeepAlive)
	return scheduled
}

// embeddings is server/routes.go EmbeddingsHandler up to scheduleRunner.
func (j *judge) embeddings(req EmbeddingRequest) verdict {
	_, m, v := j.resolve(req.Model, false)
	if v != nil {
		return *v
	}
	scheduled := j.schedule(m, nil, req.Options)
	scheduled.KeepAlive = nanoseconds(req.KeepAlive)
	return scheduled
}

// schedule is server/routes.go scheduleRunner before GetRunner: the
// capability check, then the request options (the model's own Modelfile
// options are not visible through the API and are taken as valid).
func (j *judge) schedule(m installed, caps []string, options map[string]any) verdict {
	model := m.name.DisplayShortest()
	for _, c := range caps {
		if !slices.Contains(m.caps, c) {
			return verdict{Model: model, Reason: "capability: " + c}
		}
	}
	var opts Options
	if err := opts.FromMap(options); err != nil {
		return verdict{Model: model, Reason: "options: " + err.Error()}
	}
	return verdict{CouldLoad: true, Model: model, Runner: runnerOptions(options)}
}

// runnerOptions are the load-time options (api/types.go Runner) a request's
// options set, as FromMap sets them: a JSON number (float64 in the map) is
// converted with int64(), null is skipped. The scheduler reloads a model
// whose runner was started with others (server/sched.go needsReload).
func runnerOptions(options map[string]any) map[string]any {
	set := map[string]any{}
	for _, key := range []string{"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread"} {
		if n, ok := options[key].(float64); ok {
			set[key] = int64(n)
		}
	}
	if b, ok := options["use_mmap"].(bool); ok {
		set["use_mmap"] = b
	}
	return set
}

// nanoseconds is a request's keep_alive (nil: not given, or null).
func nanoseconds(d *Duration) *int64 {
	if d == nil {
		return nil
	}
	ns := int64(d.Duration)
	return &ns
}

// hostAllowed is server/routes.go allowedHostsMiddleware for a loopback bind.
func hostAllowed(requestHost string) bool {
	host, _, err := net.SplitHostPort(requestHost)
	if err != nil {
		host = requestHost
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.IsLoopback() || addr.IsPrivate() || addr.IsUnspecified() || isLocalIP(addr) {
			return true
		}
	}
	host = strings.ToLower(host)
	if host == "" || host == "localhost" {
		return true
	}
	if hostname, err := os.Hostname(); err == nil && host == strings.ToLower(hostname) {
		return true
	}
	for _, tld := range []string{"localhost", "local", "internal"} {
		if strings.HasSuffix(host, "."+tld) {
			return true
		}
	}
	return false
}

// isLocalIP is server/routes.go isLocalIP.
func isLocalIP(ip netip.Addr) bool {
	interfaces, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, iface := range interfaces {
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if parsed, _, err := net.ParseCIDR(a.String()); err == nil && parsed.String() == ip.String() {
				return true
			}
		}
	}
	return false
}

// ollamaOrigins is envconfig/config.go AllowedOrigins.
func ollamaOrigins() []string {
	var origins []string
	if s := strings.Trim(strings.TrimSpace(os.Getenv("OLLAMA_ORIGINS")), "\"'"); s != "" {
		origins = strings.Split(s, ",")
	}
	for _, origin := range []string{"localhost", "127.0.0.1", "0.0.0.0"} {
		origins = append(origins,
			fmt.Sprintf("http://%s", origin),
			fmt.Sprintf("https://%s", origin),
			fmt.Sprintf("http://%s", net.JoinHostPort(origin, "*")),
			fmt.Sprintf("https://%s", net.JoinHostPort(origin, "*")),
		)
	}
	return append(origins, "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
}

// corsRules is gin-contrib/cors v1.7.2 (config.go, cors.go, utils.go) with
// the configuration server/routes.go GenerateRoutes gives it.
type corsRules struct {
	allowAll  bool
	exact     []string
	wildcards [][2]string
}

func newCorsRules(origins []string) *corsRules {
	c := &corsRules{}
	seen := map[string]bool{}
	for _, o := range origins {
		if o == "*" {
			c.allowAll = true
		}
		// utils.go normalize lowercases and trims the exact entries only.
		n := strings.ToLower(strings.TrimSpace(o))
		if !seen[n] {
			seen[n] = true
			c.exact = append(c.exact, n)
		}
		// cors.go parseWildcardRules works on the entries as given.
		if i := strings.Index(o, "*"); i >= 0 {
			switch {
			case i == 0:
				c.wildcards = append(c.wildcards, [2]string{"*", o[1:]})
			case i == len(o)-1:
				c.wildcards = append(c.wildcards, [2]string{o[:i], "*"})
			default:
				c.wildcards = append(c.wildcards, [2]string{o[:i], o[i+1:]})
			}
		}
	}
	return c
}

// check is config.go applyCors: "" lets the request through; OPTIONS
// requests are answered by the middleware itself.
func (c *corsRules) check(r *http.Request) string {
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "http://"+r.Host || origin == "https://"+r.Host {
		return ""
	}
	if !c.valid(origin) {
		return "cors"
	}
	if r.Method == http.MethodOptions {
		return "cors: preflight"
	}
	return ""
}

func (c *corsRules) valid(origin string) bool {
	if c.allowAll || slices.Contains(c.exact, origin) {
		return true
	}
	for _, w := range c.wildcards {
		if w[0] == "*" && strings.HasSuffix(origin, w[1]) {
			return true
		}
		if w[1] == "*" && strings.HasPrefix(origin, w[0]) {
			return true
		}
		if strings.HasPrefix(origin, w[0]) && strings.HasSuffix(origin, w[1]) {
			return true
		}
	}
	return false
}

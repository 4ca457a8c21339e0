// Command ollama-oracle is an independent reading of Ollama v0.24.0's request
// handling: it sits in front of an Ollama-compatible upstream, records for
// every request whether Ollama would have reached its scheduler (and so could
// have loaded a model), and forwards the request unchanged.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

type record struct {
	T         float64 `json:"t"`
	Method    string  `json:"method"`
	Path      string  `json:"path"`
	Query     string  `json:"query"`
	Case      string  `json:"case"`
	CouldLoad bool    `json:"could_load"`
	Model     string  `json:"model"`
	Reason    string  `json:"reason"`
	Undecided bool    `json:"undecided"`
	Host      string  `json:"host"`
	Origin    string  `json:"origin"`
	// The request's reading, compared with the simulated Ollama's: the body
	// did not decode (Ollama's 400 before anything else), the keep_alive and
	// runner options of a load, and the 500 Ollama answers after the load.
	Malformed bool           `json:"malformed"`
	KeepAlive *int64         `json:"keep_alive"`
	Runner    map[string]any `json:"runner"`
	AfterLoad string         `json:"after_load"`
}

type recorder struct {
	mu   sync.Mutex
	file *os.File
}

// write appends one line with a single write call, so that the line is in the
// file (not in a buffer of this process) before the request is forwarded.
func (r *recorder) write(rec record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.file.Write(append(line, '\n'))
	return err
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	upstream := flag.String("upstream", "", "base URL of the Ollama-compatible upstream")
	recordPath := flag.String("record", "", "file to append one JSON line per request to")
	bind := flag.String("ollama-bind", "127.0.0.1:11434", "the address Ollama is taken to listen on (its Host check applies only to a loopback bind)")
	checkTemplates := flag.Bool("check-templates", false, "read one JSON string a line on stdin and write, a JSON string a line, the error Ollama's template.Parse gives it (\"\" for none)")
	flag.Parse()
	if *checkTemplates {
		if err := templateErrors(os.Stdin, os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *upstream == "" || *recordPath == "" {
		fmt.Fprintln(os.Stderr, "usage: ollama-oracle -listen ADDR -upstream URL -record PATH")
		os.Exit(2)
	}
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("bad -upstream: %v", err)
	}
	file, err := os.OpenFile(*recordPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("open -record: %v", err)
	}
	cat := newCatalog(*upstream)
	if err := cat.refresh(); err != nil {
		log.Printf("initial /api/tags failed (will retry on each miss): %v", err)
	}
	j := newJudge(cat, *bind)
	rec := &recorder{file: file}

	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The upstream sees the Host this oracle judged.
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
	}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		v := j.judge(r, body)
		err = rec.write(record{
			T:         float64(arrived.UnixNano()) / 1e9,
			Method:    r.Method,
			Path:      r.URL.Path,
			Query:     r.URL.RawQuery,
			Case:      r.URL.Query().Get("case"),
			CouldLoad: v.CouldLoad,
			Model:     v.Model,
			Reason:    v.Reason,
			Undecided: v.Undecided,
			Host:      r.Host,
			Origin:    r.Header.Get("Origin"),
			Malformed: strings.HasPrefix(v.Reason, "decode: "),
			KeepAlive: v.KeepAlive,
			Runner:    v.Runner,
			AfterLoad: v.AfterLoad,
		})
		if err != nil {
			http.Error(w, "recording: "+err.Error(), http.StatusInternalServerError)
			return
		}
		// Replay the bytes read, with their length known.
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.TransferEncoding = nil
		if len(body) == 0 {
			r.Body = http.NoBody
		}
		proxy.ServeHTTP(w, r)
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	fmt.Printf("READY http://%s\n", ln.Addr())
	_ = os.Stdout.Sync()
	// A plain server without a ServeMux, so that no path is cleaned or
	// redirected before it is recorded and forwarded.
	log.Fatal((&http.Server{Handler: handler}).Serve(ln))
}

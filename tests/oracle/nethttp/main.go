// Command nethttp-echo is a Go net/http server with the default settings Ollama serves
// with (server/routes.go Serve: http.Server{Handler: nil}), whose one handler answers
// with a description of what net/http read: the differential corpus of the Go dialect
// (tests/dialects) compares its raw answers with the gate's reading byte for byte.
//
// Usage: nethttp-echo [-listen 127.0.0.1:0]; prints "READY host:port" once listening.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
)

// maxShown is how long a header value or a body may be before it is shown by its
// length and digest, so that an answer stays under net/http's 2048-byte buffer and is
// always sent with a Content-Length.
const maxShown = 64

func show(s string) string {
	if len(s) <= maxShown {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("<%d bytes sha256:%x>", len(s), sha256.Sum256([]byte(s)))
}

// answer writes the answer /answer?status=&h=Name:+value&body=&chunked=1 asks for, as a
// handler of Ollama's (gin's c.JSON, c.String) writes one: its fields, then the status, then
// the body; chunked flushes the head before the body, so net/http sends it chunked.
func answer(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	q := r.URL.Query()
	for _, h := range q["h"] {
		name, value, _ := strings.Cut(h, ":")
		w.Header().Add(name, strings.TrimLeft(value, " "))
	}
	status, err := strconv.Atoi(q.Get("status"))
	if err != nil {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if q.Get("chunked") == "1" {
		w.(http.Flusher).Flush()
	}
	io.WriteString(w, q.Get("body"))
}

func echo(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/answer" {
		answer(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	var b strings.Builder
	fmt.Fprintf(&b, "method %s\ntarget %s\nproto %q\nhost %q\n", show(r.Method), show(r.RequestURI), r.Proto, r.Host)
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	shown := 0
	for _, k := range keys {
		for _, v := range r.Header[k] {
			if shown < 12 {
				fmt.Fprintf(&b, "header %s: %s\n", show(k), show(v))
			}
			shown++
		}
	}
	fmt.Fprintf(&b, "headers %d\nbody %s\n", shown, show(string(body)))
	if err != nil {
		fmt.Fprintf(&b, "error %q\n", err.Error())
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, b.String())
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// DefaultServeMux redirects or refuses some targets before any handler runs; the
	// corpus is about the server, so every request reaches the echo handler.
	srv := &http.Server{Handler: http.HandlerFunc(echo), ErrorLog: log.New(io.Discard, "", 0)}
	fmt.Fprintf(os.Stdout, "READY %s\n", ln.Addr())
	log.Fatal(srv.Serve(ln))
}

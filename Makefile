# Argus — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= agent,nvml,torch,detect,streams,sinks,dev
export ARGUS_HOME ?= $(CURDIR)/.argus

.PHONY: setup kafka-up kafka-down test lint demo bench-quick clean

# Idempotent: re-installs only when pyproject.toml changed since the last setup.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	@touch $@
	@echo "setup: $(VENV) ready"

kafka-up:
	@scripts/kafka.sh up

kafka-down:
	@scripts/kafka.sh down

test: setup kafka-up
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas producers detectors streams sinks argus

demo: setup kafka-up
	$(BIN)/argus demo

bench-quick: setup kafka-up
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .argus .pytest_cache .mypy_cache .ruff_cache

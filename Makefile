# Argus — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= agent,cli,nvml,torch,detect,streams,sinks,dev
export ARGUS_HOME ?= $(CURDIR)/.argus

.PHONY: setup kafka-up kafka-down test lint demo bench-quick clean helm helm-lint helm-files

# helm for the chart's lint/template and tests/deploy/test_helm.py, built once with Go into a cache
ARGUS_CACHE ?= $(HOME)/.cache/argus
HELM_VERSION ?= v3.16.4
HELM := $(ARGUS_CACHE)/bin/helm

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
	$(BIN)/mypy argus

demo: setup kafka-up
	$(BIN)/argus demo

bench-quick: setup kafka-up
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[bench]"  # HTA, psutil for the benches
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

helm: $(HELM)

$(HELM):
	@command -v go >/dev/null || { echo "helm: Go is needed to build helm $(HELM_VERSION) (or put a helm binary at $(HELM))"; exit 1; }
	GOBIN=$(ARGUS_CACHE)/bin go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

helm-lint: $(HELM)
	$(HELM) lint helm/argus
	$(HELM) template argus helm/argus >/dev/null

# The chart's Grafana files are copies of deploy/grafana (regenerate those with `argus grafana export`).
helm-files:
	rm -rf helm/argus/files/grafana && mkdir -p helm/argus/files/grafana/alerting helm/argus/files/grafana/datasources
	cp -r deploy/grafana/dashboards helm/argus/files/grafana/dashboards
	cp deploy/grafana/provisioning/alerting/*.yaml helm/argus/files/grafana/alerting/
	cp deploy/grafana/provisioning/datasources/*.yaml helm/argus/files/grafana/datasources/

clean:
	rm -rf $(VENV) .argus .pytest_cache .mypy_cache .ruff_cache

# Argus — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= agent,cli,nvml,torch,detect,streams,sinks,dev
export ARGUS_HOME ?= $(CURDIR)/.argus

.PHONY: setup kafka-up kafka-down test lint demo bench-quick clean helm helm-lint helm-files wheel-check version-sync gpu-wheels

# helm for the chart's lint/template and tests/deploy/test_helm.py, built once with Go into a cache
ARGUS_CACHE ?= $(HOME)/.cache/argus
HELM_VERSION ?= v3.16.4
HELM := $(ARGUS_CACHE)/bin/helm

# Idempotent: re-installs only when pyproject.toml changed since the last setup with these
# EXTRAS (one stamp per set: `make setup EXTRAS=cli` first, then `make setup` or `make demo`,
# installs the rest).
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	@# PYTHONWARNINGS: setuptools warns on every editable install of a flat layout that the
	@# folder named like the package may shadow it (argus/ is that package); errors still print
	@PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
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
	$(BIN)/argus demo $(if $(DEMO_PORT),--port $(DEMO_PORT))

bench-quick: setup kafka-up
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[bench]"  # HTA, psutil for the benches
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

# Every bench at a tiny size, about a minute in all (CI, after `make test`): a bench that no
# longer runs fails; its figures are not checked. One line per bench: seconds, its JSON's start.
.PHONY: bench-smoke
bench-smoke: setup kafka-up
	@$(BIN)/python -c "import hta, psutil, scipy" 2>/dev/null || \
	  $(BIN)/python -m pip install -q --disable-pip-version-check -e ".[bench]"  # HTA, psutil
	@for b in bench/*.py; do \
	  t0=$${EPOCHREALTIME/./}; \
	  out=$$($(BIN)/python $$b --smoke 2>&1) || { echo "$$out" | tail -40; echo "bench-smoke: $$b failed"; exit 1; }; \
	  printf '%-26s %6.1f s  %.90s\n' "$$b" "$$(( $${EPOCHREALTIME/./} - t0 ))e-6" "$$(echo "$$out" | tail -1)"; \
	done

helm: $(HELM)

$(HELM):
	@command -v go >/dev/null || { echo "helm: Go is needed to build helm $(HELM_VERSION) (or put a helm binary at $(HELM))"; exit 1; }
	GOBIN=$(ARGUS_CACHE)/bin go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

helm-lint: $(HELM)
	$(HELM) lint --strict helm/argus
	$(HELM) lint --strict helm/argus --set serviceMonitor.enabled=true --set prometheusRule.enabled=true
	$(HELM) template argus helm/argus >/dev/null

# The wheel builds, installs with [agent] into a clean venv, and the Dockerfile's install line resolves.
wheel-check: setup
	@PYTHON=$(BIN)/python .ci/wheel-check

# One version: pyproject.toml's. Copies it into the chart, the compose file and the Dockerfile
# (tests/deploy/test_version.py fails while they differ).
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
version-sync:
	sed -i 's/^version: .*/version: $(VERSION)/; s/^appVersion: .*/appVersion: "$(VERSION)"/' helm/argus/Chart.yaml
	sed -i 's|image: argus:.*|image: argus:$(VERSION)|' docker-compose.yml
	sed -i 's|docker build -t argus:[^ ]* |docker build -t argus:$(VERSION) |' Dockerfile

# The chart's dashboards and alert rules are copies of deploy/grafana (regenerate those with
# `argus grafana export`); its datasource is rendered from values (templates/grafana-configmaps.yaml).
helm-files:
	rm -rf helm/argus/files/grafana && mkdir -p helm/argus/files/grafana/alerting
	cp -r deploy/grafana/dashboards helm/argus/files/grafana/dashboards
	cp deploy/grafana/provisioning/alerting/*.yaml helm/argus/files/grafana/alerting/

# The wheels scripts/gpu-check.sh installs on a GPU machine that reaches no index (Python 3.12,
# manylinux x86-64; torch, nvidia-ml-py and NVIDIA's CUPTI library are there already). cupti-python
# must match the CUDA major and minor of that machine's torch and driver (13.0 by default).
GPU_WHEELS := .gpu-wheels
GPU_CUPTI ?= cupti-python>=13.0,<13.1
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp $(foreach p,$(GPU_PLATFORMS),--platform $(p)) -d $(GPU_WHEELS) \
	  fastavro "backports.zstd" "$(GPU_CUPTI)"
	@du -sh $(GPU_WHEELS) && ls $(GPU_WHEELS)

clean:
	rm -rf $(VENV) .argus .pytest_cache .mypy_cache .ruff_cache

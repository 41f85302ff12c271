# arcvllm — the operator's menu. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON        ?= python3
VENV          ?= .venv
BUILD         ?= build
DOCKER        ?= docker
COMPOSE       ?= docker-compose
# xpu where the host has an Intel GPU render node, cpu everywhere else.
FLAVOR        ?= $(if $(wildcard /dev/dri/renderD*),xpu,cpu)
STACK         ?= $(if $(filter xpu,$(FLAVOR)),xpu-0.20,cpu)
PRESET        ?= $(if $(filter xpu,$(FLAVOR)),qwen3.6-35b-a3b-w4a16-1xb70,tiny-hybrid-cpu)
IMAGE         ?= arcvllm:$(STACK)
PORT          ?= 8000

ARCVLLM       := $(VENV)/bin/arcvllm
TEST_VENVS    := $(BUILD)/venvs

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev,client,bench]'
	touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## create the tooling venv (.venv) with arcvllm and the dev tools

.PHONY: test-venvs
test-venvs: $(VENV)/.stamp ## create the venvs with real vLLM releases that the tests run against
	scripts/test-venvs.sh $(TEST_VENVS)

.PHONY: lint
lint: $(VENV)/.stamp ## ruff, shellcheck, hadolint
	$(VENV)/bin/ruff check arcvllm tests
	$(VENV)/bin/ruff format --check arcvllm tests
	$(VENV)/bin/shellcheck scripts/*.sh scripts/ci/*.sh docker/*.sh .ci/run
	$(VENV)/bin/hadolint docker/Dockerfile

.PHONY: test-fast
test-fast: $(VENV)/.stamp ## unit tests only (no vLLM, no Docker)
	$(VENV)/bin/pytest -m 'not vllm and not docker and not server'

.PHONY: test
test: lint test-venvs ## everything: lint, unit, real vLLM code, image and smoke tests
	ARCVLLM_TEST_VENVS=$(abspath $(TEST_VENVS)) $(VENV)/bin/pytest

# ---- images and compose (docker/) ----

# ---- smoke test ----

# ---- operate: presets, doctor, bench ----

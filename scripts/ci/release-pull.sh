#!/usr/bin/env bash
# release-pull.sh DIR: on the engine scripts/ci/release-check.sh started (clean data root):
# verify, pull by digest, smoke-check (no build).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
: "${DOCKER:?the Docker client: run this with scripts/ci/engine.sh run}"
ref() { .venv/bin/arcvllm release entry "$out/manifest.json" "$1" ref; }
images=$("$DOCKER" image ls -q | wc -l)
echo "release-pull: a clean engine ($images images)"
.venv/bin/arcvllm release verify "$out/manifest.json" --key "$out/cosign.pub"
cpu=$(ref cpu)
gateway=$(ref gateway)
"$DOCKER" pull -q "$cpu"
"$DOCKER" pull -q "$gateway"
# (pytest's scratch under build/, as every other test step's: nothing left in /tmp)
ARCVLLM_RELEASE_DIR=$out .venv/bin/pytest -q -p no:cacheprovider --basetemp=build/pytest-release \
	-m release tests/builder/test_release.py
make --no-print-directory smoke-check STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu \
	IMAGE="$cpu" GATEWAY_IMAGE="$gateway" SMOKE_REPORT=reports/smoke-cpu-released.json

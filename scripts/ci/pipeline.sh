#!/usr/bin/env bash
# The CI steps, run inside scripts/ci/engine.sh (DOCKER_HOST set, base image present).
# Each step prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Every step's temporary files (pip, vLLM, torch's Inductor cache) under build/, not /tmp.
export TMPDIR=$PWD/build/tmp
mkdir -p "$TMPDIR"
before=$(ls -A /tmp)

step() {
	local start=$SECONDS
	echo "==> $*"
	"$@"
	echo "<== $* ($((SECONDS - start)) s)"
}

step make venv
step make build STACK=cpu
step make build-xpu-ci STACK=xpu-0.20
step make build-xpu-ci STACK=xpu-0.23
step make build-xpu-ci STACK=xpu-0.33
step make test
# The preset x stack table from each release's own kernel selection (also asserted in tests).
step .venv/bin/arcvllm presets --check
rm -rf "$TMPDIR"
left=$(comm -13 <(echo "$before") <(ls -A /tmp))
[[ -z $left ]] || echo "==> new in /tmp during the run: $left"
echo "==> CI total: $SECONDS s"

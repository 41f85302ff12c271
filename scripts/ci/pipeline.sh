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

# The images (Docker's BuildKit) and the test venvs (pip) at the same time: one waits on
# the package index while the other unpacks. Each side's steps print their times; a side's
# log is shown when it fails.
images() {
	step make build STACK=cpu
	step make build-xpu-ci STACK=xpu-0.20
	step make build-xpu-ci STACK=xpu-0.23
	step make build-xpu-ci STACK=xpu-0.33
}
venvs() {
	step make test-venvs
}

step make venv
# apt before anything runs in parallel (one dpkg lock)
step make tools
images >"$TMPDIR/images.log" 2>&1 &
images_pid=$!
venvs >"$TMPDIR/venvs.log" 2>&1 &
venvs_pid=$!
status=0
wait "$venvs_pid" || status=$?
grep -E '^(==>|<==)' "$TMPDIR/venvs.log" || true
[[ $status == 0 ]] || { cat "$TMPDIR/venvs.log"; kill "$images_pid" 2>/dev/null || true; exit "$status"; }
wait "$images_pid" || status=$?
grep -E '^(==>|<==)' "$TMPDIR/images.log" || true
[[ $status == 0 ]] || { tail -n 200 "$TMPDIR/images.log"; exit "$status"; }
step make test
# The preset x stack table from each release's own kernel selection (also asserted in tests).
step .venv/bin/arcvllm presets --check
rm -rf "$TMPDIR"
left=$(comm -13 <(echo "$before") <(ls -A /tmp))
[[ -z $left ]] || echo "==> new in /tmp during the run: $left"
echo "==> CI total: $SECONDS s"

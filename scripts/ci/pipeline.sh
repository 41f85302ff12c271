#!/usr/bin/env bash
# `make test` on a fresh machine, inside scripts/ci/engine.sh (DOCKER_HOST set, base image
# present): set-up, lint, every image, every test. The images build (Docker's BuildKit,
# mostly waiting on the package indexes) while the tests that need no image run; then the
# image tests. Each step prints how long it took.
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

images() {
	step make build STACK=cpu
	step make build-xpu-ci STACK=xpu-0.23
	step make build-xpu-ci STACK=xpu-0.20
	step make build-xpu-ci STACK=xpu-0.33
	step make scale-images
}

step make venv
step make lint
# apt before anything runs in parallel (one dpkg lock)
step make tools
images >"$TMPDIR/images.log" 2>&1 &
images_pid=$!
trap 'kill "$images_pid" 2>/dev/null || true' EXIT
step make test-venvs
status=0
step make test-host || status=$?
echo "==> waiting for the images"
wait "$images_pid" || { grep -E '^(==>|<==)' "$TMPDIR/images.log"; tail -n 200 "$TMPDIR/images.log"; exit 1; }
trap - EXIT
grep -E '^(==>|<==)' "$TMPDIR/images.log"
[[ $status == 0 ]] || exit "$status"
step make test-images
# The preset x stack table from each release's own kernel selection (also asserted in tests).
step .venv/bin/arcvllm presets --check
rm -rf "$TMPDIR"
left=$(comm -13 <(echo "$before") <(ls -A /tmp))
[[ -z $left ]] || echo "==> new in /tmp during the run: $left"
echo "==> CI total: $SECONDS s"

#!/usr/bin/env bash
# `make test` on a fresh machine, inside scripts/ci/engine.sh (DOCKER_HOST set, base image
# present): set-up, lint, every image, every test, each step timed. Two streams share the
# machine: the images build in the background (the CPU image and the small ones first,
# then the XPU rehearsals, mostly waiting on the package indexes) while the tests run in
# the foreground: first those that need no image, then those of the CPU images (the XPU
# builds go on meanwhile), last those of the XPU rehearsals. Every test step runs even
# after a failed one; the exit status is the first failure's.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Every step's temporary files (pip, vLLM, torch's Inductor cache) under build/, not /tmp.
export TMPDIR=$PWD/build/tmp
mkdir -p "$TMPDIR"
before=$(ls -A /tmp)
cpu_ready=$TMPDIR/cpu-images-ready
rm -f "$cpu_ready"

# (The status is taken explicitly: a function run left of || runs without set -e.)
step() {
	local start=$SECONDS rc=0
	echo "==> $*"
	"$@" || rc=$?
	if [[ $rc == 0 ]]; then
		echo "<== $* ($((SECONDS - start)) s)"
	else
		echo "<== $* ($((SECONDS - start)) s, FAILED: exit $rc)"
	fi
	return "$rc"
}

images() {
	step make build STACK=cpu
	step make scale-images gateway-image
	touch "$cpu_ready"
	step make build-xpu-ci STACK=xpu-0.23
	step make build-xpu-ci STACK=xpu-0.20
	step make build-xpu-ci STACK=xpu-0.33
}

status=0
test_step() {
	local rc=0
	step "$@" || rc=$?
	if [[ $rc != 0 && $status == 0 ]]; then status=$rc; fi
}

step make venv
step make lint
# apt before anything runs in parallel (one dpkg lock)
step make tools
images >"$TMPDIR/images.log" 2>&1 &
images_pid=$!
trap 'kill "$images_pid" 2>/dev/null || true' EXIT
step make test-venvs
test_step make test-host
echo "==> waiting for the CPU images"
while [[ ! -e $cpu_ready ]] && kill -0 "$images_pid" 2>/dev/null; do sleep 5; done
grep -E '^(==>|<==)' "$TMPDIR/images.log"
if [[ ! -e $cpu_ready ]]; then
	tail -n 200 "$TMPDIR/images.log"
	exit 1
fi
test_step make test-images-cpu
echo "==> waiting for the XPU rehearsals"
wait "$images_pid" || { grep -E '^(==>|<==)' "$TMPDIR/images.log"; tail -n 200 "$TMPDIR/images.log"; exit 1; }
trap - EXIT
grep -E '^(==>|<==)' "$TMPDIR/images.log"
test_step make test-images-xpu
test_step make smoke-emulated STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu
# The preset x stack table from each release's own kernel selection (also asserted in tests).
test_step .venv/bin/arcvllm presets --check
rm -rf "$TMPDIR"
left=$(comm -13 <(echo "$before") <(ls -A /tmp))
[[ -z $left ]] || echo "==> new in /tmp during the run: $left"
echo "==> CI total: $SECONDS s (exit $status)"
exit "$status"

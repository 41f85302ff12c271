#!/usr/bin/env bash
# `make test` on a fresh machine, inside scripts/ci/engine.sh (DOCKER_HOST set, base image
# present): set-up, lint, every image, every test, each step timed. Two streams share the
# machine:
#   images (background): the stand-ins, the default XPU stack's rehearsal and its tests
#     (once the test venvs are made: they run real vLLM releases' Python from
#     build/venvs), the CPU image and the small images, the release rehearsal (make
#     release into a local registry), the router's second clean build (one digest with the
#     release's), the base images made anew (make test-base), the CPU image's MTP smoke
#     test and its acceptance test (make verify-check), with
#     REPRO_CPU=1 the CPU image's second clean build (one digest with the release's);
#   tests (foreground): the document commands (every shell block of README.md and docs/),
#     the unit tests while the test venvs are made, the
#     tests of real vLLM releases (`presets --check` among them), those of the CPU images
#     (the deployments).
# Every test step runs even after a failed one; the exit status is the first failure's.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DOCKER:?the Docker client: run this with scripts/ci/engine.sh run}"

# The release rehearsal's tools come with the engine engine.sh installs; an engine that was
# already running (a user's own Docker) may have come without them: one line now, not a
# failure half an hour in.
lacking=()
for tool in cosign skopeo docker-registry; do
	command -v "$tool" >/dev/null || lacking+=("$tool")
done
if ((${#lacking[@]})); then
	echo "pipeline: no ${lacking[*]} on PATH (the release rehearsal's): install Debian's packages of those names (scripts/ci/engine.sh installs them as root with the engine it installs)" >&2
	exit 3
fi

# Every step's temporary files (pip, vLLM, torch's Inductor cache) under build/, not /tmp.
export TMPDIR=$PWD/build/tmp
mkdir -p "$TMPDIR"
# The foreground's output kept too: the run's last lines name what failed (CI shows a tail).
exec > >(tee "$TMPDIR/main.log") 2>&1
failed_steps=$TMPDIR/failed-steps
rm -f "$failed_steps"
before=$(ls -A /tmp)
cpu_ready=$TMPDIR/cpu-images-ready
cpu_tests_done=$TMPDIR/cpu-tests-done
main_pid=$$
images_status=$TMPDIR/images-status
venvs_status=$TMPDIR/venvs-status
rm -f "$cpu_ready" "$cpu_tests_done" "$images_status" "$venvs_status"
# What the tests measured (tests/support/measured.py), printed at the end.
export ARCVLLM_MEASURED=$PWD/reports/measured.txt
rm -f "$ARCVLLM_MEASURED"

# (The status is taken explicitly: a function run left of || runs without set -e.)
step() {
	local start=$SECONDS rc=0
	echo "==> $*"
	"$@" || rc=$?
	if [[ $rc == 0 ]]; then
		echo "<== $* ($((SECONDS - start)) s; $(free_gb "$engine_root") GB free)"
	else
		echo "<== $* ($((SECONDS - start)) s, FAILED: exit $rc; $(free_gb "$engine_root") GB free)"
		echo "$* (exit $rc)" >>"$failed_steps"
	fi
	return "$rc"
}

# Waits until FILE exists or process PID has ended; true if FILE exists.
wait_for() {
	while [[ ! -e $1 ]] && kill -0 "$2" 2>/dev/null; do sleep 5; done
	[[ -e $1 ]]
}

# The test venvs (made by venvs() in the background) are made and whole.
venvs_ok() {
	wait_for "$venvs_status" "$venvs_pid" && [[ $(<"$venvs_status") == 0 ]]
}

# The engine's disk: each step's end line says what is free there.
engine_root=$("$DOCKER" info --format '{{.DockerRootDir}}')
status=0
test_step() {
	local rc=0
	step "$@" || rc=$?
	if [[ $rc != 0 && $status == 0 ]]; then status=$rc; fi
}

# Room on the engine's disk (measured here): an XPU rehearsal peaks at ~25 GB (its lock
# alone unpacks to 13 GB, its probe torch for the patch and models stages adds ~7 GB of
# cache), so it runs first, on an engine that holds nothing else, and its images and build
# cache go before the CPU image is built; the CPU image's --no-cache build makes its layers
# again and a 2.9 GB layout. Short of room then, the build cache goes once the CPU image's
# tests (the only builds beside this stream, all cache hits) are done.
REPRO_ROOM_GB=20
RELEASE_CHECK_ROOM_GB=20
# (Its own function: a redirect on `step` would swallow the step's timing lines too.)
# shellcheck disable=SC2329 # run through step
prune_build_cache() { "$DOCKER" builder prune -af >/dev/null; }
# GB free where PATH is ("?" where df cannot tell: an engine on another host).
free_gb() {
	local gb
	gb=$(df --output=avail -BG "$1" 2>/dev/null | tail -n 1 | tr -dc 0-9) || true
	echo "${gb:-?}"
}
make_room() {
	local free
	free=$(free_gb "$engine_root")
	[[ $free != "?" ]] && ((free < $1)) || return 0
	echo "==> $free GB free, $1 wanted: the build cache goes after the CPU image's tests"
	wait_for "$cpu_tests_done" "$main_pid" || true
	step prune_build_cache
}

# The XPU rehearsal of each stack in XPU_CI_STACKS (default: the default stack; `all`, or
# names; the hosted CI runs every XPU stack's, one runner each: `make rehearsal`), then its
# tests (they run real vLLM releases' Python from build/venvs), then its images and build
# cache go (the containerd store holds an image twice: layer blobs and unpacked snapshots).
# The default stack's turn also runs the rehearsal tests that name no stack.
xpu_rehearsals() {
	local stack default others stacks tests
	default=$(.venv/bin/arcvllm stack default xpu)
	others=$(.venv/bin/arcvllm stack list --json | .venv/bin/python -c 'import json, sys
print(*(s["name"] for s in json.load(sys.stdin) if s["flavor"] == "xpu" and not s["default"]))')
	stacks=${XPU_CI_STACKS:-$default}
	[[ $stacks != all ]] || stacks="$default $others"
	for stack in ${stacks//,/ }; do
		if step make build-xpu-ci STACK="$stack"; then
			# (pytest -k: this stack's tests; the default's turn: those of no other stack too)
			tests=$stack
			[[ $stack != "$default" || -z $others ]] || tests="$stack or not (${others// / or })"
			if venvs_ok; then
				test_step make test-images-xpu XPU_TESTS="$tests"
			else
				echo "<== make test-venvs: FAILED (the rehearsal tests of $stack not run)"
				echo "make test-venvs (the rehearsal tests of $stack not run)" >>"$failed_steps"
				[[ $status != 0 ]] || status=1
			fi
		elif [[ $status == 0 ]]; then
			status=1
		fi
		"$DOCKER" image rm -f "arcvllm:$stack-ci" "arcvllm:$stack-ci-user" >/dev/null 2>&1 || true
		step prune_build_cache
	done
}

# The CPU image as an operator checks it (README, docs/verify.md), in the images stream
# once its builds are done, beside the foreground's deployment tests rather than after them
# (the images stream ends before they do): the acceptance test, its own compose project on
# its own port (make's VERIFY_PORT; the smoke test's is SMOKE_PORT), beside the MTP
# preset's smoke test.
# Every row but preemption: the image's 1 GiB KV cache holds eight requests of the tiny
# model's max-model-len, so nothing is preempted and that row would say INCOMPLETE (exit 4);
# tests/verify/test_verify_server.py runs it on a server of 16 KV blocks.
acceptance() {
	local verify_pid verify_status
	(
		test_step make verify-check STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu \
			VERIFY_ARGS="--rows 'boundary decode,chunked prefill,cached prefix resumed,mixed batches,max-model-len,prompt residues mod 64,degeneration'"
		echo "$status" >"$TMPDIR/verify-status"
	) >"$TMPDIR/verify.log" 2>&1 &
	verify_pid=$!
	# The MTP preset's smoke test (speculative == plain token for token;
	# tests/serving/test_spec_server.py runs it emulated). The emulated one is the release's,
	# pulled by digest on a clean engine (scripts/ci/release-check.sh).
	test_step make smoke-check STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu-mtp \
		SMOKE_REPORT=reports/smoke-cpu-mtp.json
	wait "$verify_pid" || true
	cat "$TMPDIR/verify.log"
	verify_status=$(cat "$TMPDIR/verify-status" 2>/dev/null || echo 1)
	[[ $verify_status == 0 || $status != 0 ]] || status=$verify_status
}

images() {
	# A clean builder: a build cache another commit left holds layers whose files carry the
	# time they were built, and the export's timestamp rewrite only clamps times after the
	# commit's, so the release's build would take them and the --no-cache build would not
	# (one digest each). A fresh machine has none; a reused one drops it here.
	step prune_build_cache
	# The stand-ins first: they are in the build context (build/wheelhouse/standins), and
	# made after the CPU image they would change it and force a rebuild.
	step make standins
	# The XPU rehearsals while the engine holds nothing else (the foreground's unit tests
	# and test-vllm need no image), their build cache gone after them: the CPU image's
	# build starts from a clean builder.
	xpu_rehearsals
	step make build STACK=cpu
	step make scale-images gateway-image
	touch "$cpu_ready"
	# make release into a local registry while the CPU layers are cached (the clean engine's
	# pull, verify and smoke are release-check.sh's, after this run).
	test_step make release-rehearsal
	# One more clean build of the router (apt, a venv, pip, a user) against the release's
	# layout of it: one digest.
	test_step make reproducible REPRO_IMAGES=router REPRO_BUILDS=2
	# The base images made anew with mmdebstrap (engine.sh's twice, the stand-ins' as a
	# user): they need no image of this run, and here they leave the foreground's
	# deployment tests the cores.
	test_step make test-base
	acceptance
	# Two clean builds of the CPU image give one digest: the release rehearsal's layout (its
	# layers from this run's first build, on a new engine) against one more with --no-cache.
	# (REPRO_CPU=1 only: ~10 minutes of both cores, which this machine's run gives to the
	# deployment tests beside it; the hosted CI, on a runner with more cores, sets it.)
	if [[ ${REPRO_CPU:-0} == 1 ]]; then
		make_room "$REPRO_ROOM_GB"
		test_step make reproducible REPRO_IMAGES=cpu REPRO_BUILDS=2
	fi
	echo "$status" >"$images_status"
}

# Writes its exit status to $venvs_status when done, for both streams to wait on (venvs_ok).
venvs() {
	local rc=0
	make test-venvs >"$TMPDIR/venvs.log" 2>&1 || rc=$?
	echo "$rc" >"$venvs_status"
}

# What the images stream did: its steps, pytest's verdicts, the tests that failed and their
# assertion lines, and the digests of the two clean CPU builds (the tail of it if it failed).
report_images() {
	grep -E '^(==>|<==)|^=+ .*(passed|failed|error).* in [0-9.]+s|^(FAILED|ERROR) |^E  |^reproducible |^[a-z]+-[12]: sha256:|^the same image|^arcvllm: .*building once more' \
		"$TMPDIR/images.log" || true
}

step make venv
step make lint
# the Debian tools the tests run, unpacked in build/tools (scripts/ci/tools.sh)
step make tools
# The venvs first: the images stream waits on them too.
venvs &
venvs_pid=$!
images >"$TMPDIR/images.log" 2>&1 &
images_pid=$!
trap 'kill "$images_pid" "$venvs_pid" 2>/dev/null || true' EXIT
# The document commands: each shell block's commands, options, paths and variables exist;
# the cheap ones run as written (tests/support/documents.py).
test_step make test-docs
test_step make test-fast
echo "==> waiting for the test venvs"
if ! venvs_ok; then
	tail -n 100 "$TMPDIR/venvs.log"
	echo "<== make test-venvs: FAILED"
	exit 1
fi
grep '^test-venvs:' "$TMPDIR/venvs.log" || true
echo "<== make test-venvs (done $SECONDS s into the run)"
test_step make test-vllm
echo "==> waiting for the CPU images"
if ! wait_for "$cpu_ready" "$images_pid"; then
	report_images
	tail -n 200 "$TMPDIR/images.log"
	exit 1
fi
# (Never an early exit from here on: the images stream waits on $cpu_tests_done to prune.)
test_step make test-images-cpu
touch "$cpu_tests_done"
echo "==> waiting for the images stream (release rehearsal, base images, smoke and acceptance tests)"
wait "$images_pid" || true
trap - EXIT
report_images
if [[ ! -e $images_status ]]; then
	tail -n 200 "$TMPDIR/images.log"
	exit 1
fi
if [[ $(cat "$images_status") != 0 ]]; then
	tail -n 200 "$TMPDIR/images.log"
	[[ $status != 0 ]] || status=$(cat "$images_status")
fi
# The build cache goes, if release-check.sh's clean engine (the pulled CPU image and
# gateway, ~5 GB) would be short of room.
free=$(free_gb "$PWD")
[[ $free == "?" ]] || ((free >= RELEASE_CHECK_ROOM_GB)) || step prune_build_cache || true
df -h "$PWD" | tail -n 1
if [[ -s $ARCVLLM_MEASURED ]]; then
	echo "==> measured by the tests"
	cat "$ARCVLLM_MEASURED"
fi
# What failed, last, where a tail shows it: each failed step, and pytest's lines naming
# the tests that failed in either stream.
if [[ -s $failed_steps ]]; then
	echo "==> failed steps"
	cat "$failed_steps"
	grep -hE '^(FAILED|ERROR) ' "$TMPDIR/main.log" "$TMPDIR/images.log" | cut -c 1-300 || true
fi
rm -rf "$TMPDIR"
left=$(comm -13 <(echo "$before") <(ls -A /tmp))
[[ -z $left ]] || echo "==> new in /tmp during the run: $left"
echo "==> CI total: $SECONDS s (exit $status)"
exit "$status"

#!/usr/bin/env bash
# release-pull.sh DIR: on the engine scripts/ci/release-check.sh chose (as root: a clean data
# root; RELEASE_ENGINE=shared: the engine that answers, the release's images removed from it
# first): verify, pull by digest, the emulated smoke test (no build). VENV: the tooling venv (.venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
venv=${VENV:-.venv}
: "${DOCKER:?the Docker client: run this with scripts/ci/engine.sh run}"
ref() { "$venv"/bin/arcvllm release entry "$out/manifest.json" "$1" ref; }
cpu=$(ref cpu)
gateway=$(ref gateway)
if [[ ${RELEASE_ENGINE:-} == shared ]]; then
	# Every reference to the release's repositories (its digests, tags a test or an earlier
	# run left), so that nothing of the release answers by name before the pull. (A digest
	# reference goes with the last tag of its image: its own rm then finds none.)
	removed=0
	for repository in "${cpu%@*}" "${gateway%@*}"; do
		while read -r name; do
			if "$DOCKER" image rm "$name" >/dev/null 2>&1; then removed=$((removed + 1)); fi
		done < <("$DOCKER" image ls --digests --format '{{.Repository}}:{{.Tag}} {{.Repository}}@{{.Digest}}' \
			"$repository" | tr ' ' '\n' | grep -v -e ':<none>$' -e '@<none>$' | sort -u)
	done
	for image in "$cpu" "$gateway"; do
		if "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
			echo "release-pull: $image is still on this engine after removing its references" >&2
			exit 1
		fi
	done
	echo "release-pull: the engine that answers, $removed references of the release removed ($("$DOCKER" image ls -q | wc -l) images left)"
else
	echo "release-pull: a clean engine ($("$DOCKER" image ls -q | wc -l) images)"
fi
"$venv"/bin/arcvllm release verify "$out/manifest.json" --key "$out/cosign.pub"
"$DOCKER" pull -q "$cpu"
"$DOCKER" pull -q "$gateway"
# (pytest's scratch under build/, as every other test step's: nothing left in /tmp)
ARCVLLM_RELEASE_DIR=$out "$venv"/bin/pytest -q -p no:cacheprovider --basetemp=build/pytest-release \
	-m release tests/builder/test_release.py
# The smoke test with the high-address emulation on (docs/smoke.md): the plain smoke test
# and the XPU-like pointers the patch series is for, on the image as released.
make --no-print-directory smoke-emulated STACK=cpu FLAVOR=cpu PRESET=tiny-hybrid-cpu \
	IMAGE="$cpu" GATEWAY_IMAGE="$gateway" EMULATED_REPORT=reports/smoke-cpu-released.json

#!/usr/bin/env bash
# After the pipeline: the release scripts/ci/release-rehearsal.sh pushed, taken as an
# operator takes it: every digest's signature and SBOM attestation verified (and a
# foreign-signed or unsigned digest refused: tests/builder/test_release.py -m release), the
# CPU image and the gateway pulled by digest, and `make smoke-emulated` passed on them with no
# build. Stops the registry.
# As root: on a Docker engine of its own with a new, empty data root (nothing built,
# nothing cached), stopped and its data root removed at the end.
# As any other user (no second dockerd without root): on the engine that answers, the
# release's images removed from it first; layers other images there share stay cached, so
# the pull proves the digests and the registry, not a cold cache (docs/release.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${RELEASE_DIR:-$PWD/build/release/ci}
if [[ ! -f $out/manifest.json ]]; then
	echo "release-check: no release at $out (make release-rehearsal; make test runs it)" >&2
	scripts/ci/registry.sh down
	exit 3
fi
status=0
if [[ $(id -u) != 0 ]]; then
	echo "release-check: not root, so no clean engine: the release's images are removed from this engine and pulled again by digest"
	RELEASE_ENGINE=shared BASE_IMAGE=none scripts/ci/engine.sh run scripts/ci/release-pull.sh "$out" ||
		status=$?
	scripts/ci/registry.sh down
	exit "$status"
fi
root=$PWD/build/engine-clean
# One engine at a time: a second dockerd removes the first one's docker0 bridge.
if scripts/ci/engine.sh answers; then
	echo "release-check: a Docker engine still answers on /run/arcvllm-docker: stop it first (scripts/ci/engine.sh down)" >&2
	exit 3
fi
rm -rf "$root"
ARCVLLM_DOCKER_ROOT=$root ARCVLLM_DOCKER_RUN=/run/arcvllm-docker-clean BASE_IMAGE=none \
	ARCVLLM_DOCKER_BRIDGE=none scripts/ci/engine.sh run scripts/ci/release-pull.sh "$out" || status=$?
rm -rf "$root"
scripts/ci/registry.sh down
exit "$status"

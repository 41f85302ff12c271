#!/usr/bin/env bash
# After the pipeline: the release scripts/ci/release-rehearsal.sh pushed, taken as an
# operator takes it, on a Docker engine with a new, empty data root (nothing built, nothing
# cached): every digest's signature and SBOM attestation verified (and a foreign-signed or
# unsigned digest refused: tests/builder/test_release.py -m release), the CPU image and the gateway
# pulled by digest, and `make smoke-check` passed on them with no build. Stops that engine,
# removes its data root and stops the registry.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${RELEASE_DIR:-$PWD/build/release/ci}
root=$PWD/build/engine-clean
# One engine at a time: a second dockerd removes the first one's docker0 bridge.
if scripts/ci/engine.sh answers; then
	echo "release-check: a Docker engine still answers on /run/arcvllm-docker: stop it first (scripts/ci/engine.sh down)" >&2
	exit 3
fi
rm -rf "$root"
status=0
ARCVLLM_DOCKER_ROOT=$root ARCVLLM_DOCKER_RUN=/run/arcvllm-docker-clean BASE_IMAGE=none \
	ARCVLLM_DOCKER_BRIDGE=none scripts/ci/engine.sh run scripts/ci/release-pull.sh "$out" || status=$?
rm -rf "$root"
scripts/ci/registry.sh down
exit "$status"

#!/usr/bin/env bash
# `make test`: the pipeline on the engine scripts/ci/engine.sh provides, then, if it passed,
# the release it pushed checked on a clean engine (scripts/ci/release-check.sh, which stops
# the registry; without root: on the same engine, the release's images removed first). The registry the release rehearsal started is stopped whatever happens.
set -euo pipefail
cd "$(dirname "$0")/../.."
trap 'scripts/ci/registry.sh down' EXIT
status=0
scripts/ci/engine.sh run scripts/ci/pipeline.sh || status=$?
if ((status == 0)); then
	scripts/ci/release-check.sh || status=$?
fi
exit "$status"

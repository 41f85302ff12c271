#!/usr/bin/env bash
# build-vllm-xpu.sh SRC BUILD_REQS ARCVLLM_DIST DIST: build vLLM's XPU wheel from a
# release's source tree SRC into DIST. The build series (patches/vllm/build/) goes in
# first with arcvllm's own tool (its wheel in ARCVLLM_DIST), each patch checked by its
# probe against the release's setup.py; the build fails unless the result is what
# `arcvllm patches plan --build` expects for the release. On XPU vLLM builds no C++
# extension then; it builds against the torch of the running environment
# (--no-build-isolation: setup.py imports torch, and the sdist's build requirements pin a
# CUDA torch). Runs in a build stage of its own: its tools never reach the runtime's venv.
set -euo pipefail

src=$1 build_reqs=$2 arcvllm_dist=$3 dist=$4
pip install --no-deps --require-hashes -r "$build_reqs"
pip install --no-deps "$arcvllm_dist"/arcvllm-*.whl
# A sdist carries its version in PKG-INFO; setuptools-scm needs it spelled out without .git.
if [[ ! -d $src/.git ]]; then
	version=$(sed -n 's/^Version: //p' "$src/PKG-INFO")
	export SETUPTOOLS_SCM_PRETEND_VERSION=$version
fi
version=$(python3 -c 'import sys; from arcvllm.patching.target import find; print(find(sys.argv[1]).version)' "$src")
export VLLM_TARGET_DEVICE=xpu
arcvllm patches apply --build --target "$src" --out /tmp/build-patches.json \
	--expect "$(arcvllm patches plan --build --vllm-version "$version")"
pip wheel --no-deps --no-build-isolation --wheel-dir "$dist" "$src"
mv /tmp/build-patches.json "$dist/"

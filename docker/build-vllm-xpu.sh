#!/usr/bin/env bash
# build-vllm-xpu.sh SRC BUILD_REQS DIST: build vLLM's XPU wheel from a release's source.
# On XPU vLLM builds at most one small C++ extension (spinloop, from 0.23), against the torch of
# the running environment (--no-build-isolation: setup.py imports torch, and the sdist's
# build requirements pin a CUDA torch). Shared by the XPU flavour and its CI stand-in.
set -euo pipefail

src=$1 build_reqs=$2 dist=$3
pip install --no-deps --require-hashes -r "$build_reqs"
# A sdist carries its version in PKG-INFO; setuptools-scm needs it spelled out without .git.
if [[ ! -d $src/.git ]]; then
	version=$(sed -n 's/^Version: //p' "$src/PKG-INFO")
	export SETUPTOOLS_SCM_PRETEND_VERSION=$version
fi
VLLM_TARGET_DEVICE=xpu pip wheel --no-deps --no-build-isolation --wheel-dir "$dist" "$src"

#!/usr/bin/env bash
# install-vllm-xpu.sh WHEEL LOCK DEPS_FROM [PIP_ARGS...]: install vLLM's XPU wheel over the
# stack's lock, which the image already carries (installed --no-deps, kernels verified).
# vLLM 0.20 and 0.23 name their kernels by URL in the wheel's requirements; pip downloads a
# URL requirement again even when that project is installed, unverified. So vLLM goes in
# --no-deps and its other requirements follow, as constraints of the lock:
#   DEPS_FROM=lock   --no-index: every requirement must already be installed from the lock;
#                    one the lock lacks fails the build (no unpinned download)
#   DEPS_FROM=index  what the lock lacks resolves within vLLM's ranges from the default
#                    index only (pip's own: PyPI or the operator's mirror). The XPU index
#                    takes no part: the lock's +xpu wheels are already installed, each by
#                    its exact pin from that index alone (the torch-xpu stage), so no other
#                    name can resolve to a file of the XPU index. The lock's versions
#                    constrain it without their hashes (a `--hash` in a constraints file
#                    turns on pip's hash-checking mode for every download, which the
#                    unpinned rest cannot pass).
# PIP_ARGS may not name an index (--index-url, --extra-index-url): in index mode it would
# take part in resolving every name; PIP_EXTRA_INDEX_URL is ignored for the same reason.
set -euo pipefail

wheel=$1 lock=$2 deps_from=$3
shift 3
if [[ $deps_from != lock && $deps_from != index ]]; then
	echo "install-vllm-xpu: DEPS_FROM is lock or index, not '$deps_from'" >&2
	exit 2
fi
for arg in "$@"; do
	case $arg in
	-i | --index-url* | --extra-index-url*)
		echo "install-vllm-xpu: $arg: vLLM's requirements resolve from the default index only" >&2
		exit 2
		;;
	esac
done
unset PIP_EXTRA_INDEX_URL
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
requires=$tmp/vllm-requires.txt
constraints=$tmp/vllm-constraints.txt
pip install --no-deps "$wheel"
python3 - "$requires" <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

wanted = []
for line in requires("vllm") or []:
    req = Requirement(line)
    if req.name.lower().replace("_", "-") == "vllm-xpu-kernels":
        continue  # installed before, by sha256 (configs/stacks.yaml VLLM_XPU_KERNELS)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        wanted.append(str(req))
with open(sys.argv[1], "w") as out:
    out.write("\n".join(wanted) + "\n")
PY
if [[ $deps_from == lock ]]; then
	pip install --no-index "$@" -c "$lock" -r "$requires"
else
	sed -e 's/ --hash=sha256:[0-9a-f]*//g' "$lock" >"$constraints"
	pip install "$@" -c "$constraints" -r "$requires"
fi

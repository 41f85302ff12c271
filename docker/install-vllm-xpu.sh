#!/usr/bin/env bash
# install-vllm-xpu.sh WHEEL LOCK DEPS_FROM [PIP_ARGS...]: install vLLM's XPU wheel over the
# stack's lock, which the image already carries (installed --no-deps, kernels verified).
# vLLM 0.20 and 0.23 name their kernels by URL in the wheel's requirements; pip downloads a
# URL requirement again even when that project is installed, unverified. So vLLM goes in
# --no-deps and its other requirements follow, as constraints of the lock:
#   DEPS_FROM=lock   --no-index: every requirement must already be installed from the lock;
#                    one the lock lacks fails the build (no unpinned download)
#   DEPS_FROM=index  what the lock lacks resolves within vLLM's ranges, the lock's versions
#                    as constraints without their hashes (a `--hash` in a constraints file
#                    turns on pip's hash-checking mode for every download, which the
#                    unpinned rest cannot pass), in two pip calls that never share an index:
#                    the +xpu names (XPU_NAMES and the lock's version-only pins, e.g. 0.20's
#                    unpinned torchaudio) from the XPU indexes alone (--xpu-index URL,
#                    repeatable), and everything else from the default index alone (pip's
#                    own: PyPI or the operator's mirror): no other name can resolve to a
#                    file of the XPU index, no +xpu name to a file of the default one.
# No other index may be given (--index-url, --extra-index-url are refused);
# PIP_EXTRA_INDEX_URL is ignored for the same reason.
set -euo pipefail

# What PyTorch's XPU index builds for XPU (torch's +xpu family).
XPU_NAMES="torch torchvision torchaudio triton-xpu triton pytorch-triton-xpu"

wheel=$1 lock=$2 deps_from=$3
shift 3
if [[ $deps_from != lock && $deps_from != index ]]; then
	echo "install-vllm-xpu: DEPS_FROM is lock or index, not '$deps_from'" >&2
	exit 2
fi
xpu_index=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--xpu-index)
		[[ $# -ge 2 && -n $2 ]] || { echo "install-vllm-xpu: --xpu-index needs a URL" >&2; exit 2; }
		xpu_index+=("$2")
		shift 2
		;;
	*)
		echo "install-vllm-xpu: $1: the only option is --xpu-index URL (the +xpu names' index)" >&2
		exit 2
		;;
	esac
done
unset PIP_EXTRA_INDEX_URL
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
requires=$tmp/vllm-requires.txt
xpu_requires=$tmp/vllm-requires-xpu.txt
constraints=$tmp/vllm-constraints.txt
pip install --no-deps "$wheel"
python3 - "$requires" "$xpu_requires" "$lock" "$XPU_NAMES" <<'PY'
import re
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


rest_file, xpu_file, lock, names = sys.argv[1:5]
xpu = {norm(n) for n in names.split()}
for line in open(lock):  # the lock's version-only pins: what only the XPU index serves
    if re.match(r"^[A-Za-z0-9][^ ]*==[^ ]+$", line.strip()):
        xpu.add(norm(line.split("==")[0]))
rest, on_xpu = [], []
for line in requires("vllm") or []:
    req = Requirement(line)
    if norm(req.name) == "vllm-xpu-kernels":
        continue  # installed before, by sha256 (configs/stacks.yaml VLLM_XPU_KERNELS)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        (on_xpu if norm(req.name) in xpu else rest).append(str(req))
for path, wanted in ((rest_file, rest), (xpu_file, on_xpu)):
    with open(path, "w") as out:
        out.write("".join(f"{w}\n" for w in wanted))
PY
if [[ $deps_from == lock ]]; then
	cat "$xpu_requires" >>"$requires"
	pip install --no-index -c "$lock" -r "$requires"
else
	sed -e 's/ --hash=sha256:[0-9a-f]*//g' "$lock" >"$constraints"
	if [[ -s $xpu_requires ]]; then
		if [[ ${#xpu_index[@]} -eq 0 ]]; then
			echo "install-vllm-xpu: vLLM wants $(tr '\n' ' ' <"$xpu_requires")from the XPU index: give --xpu-index URL" >&2
			exit 2
		fi
		args=(--index-url "${xpu_index[0]}")
		for url in "${xpu_index[@]:1}"; do args+=(--extra-index-url "$url"); done
		pip install "${args[@]}" -c "$constraints" -r "$xpu_requires"
	fi
	pip install -c "$constraints" -r "$requires"
fi

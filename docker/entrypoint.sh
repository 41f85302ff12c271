#!/usr/bin/env bash
# The image's entrypoint. Keeps vllm/vllm-openai's contract and adds presets:
#   IMAGE --model M ...      args starting with `-`: vLLM's OpenAI server with those args
#   IMAGE PRESET [ARGS...]   a preset name: `arcvllm serve --preset PRESET -- ARGS...`
#   IMAGE                    the preset in $ARCVLLM_PRESET (the flavour's default)
#   IMAGE CMD [ARGS...]      anything else runs as is (arcvllm doctor, bash, ...)
set -euo pipefail

# The cache volume may be fresh (or a host folder): make the folders vLLM writes to.
mkdir -p "${TMPDIR:-/tmp}" "${HF_HOME:-$HOME/.cache/huggingface}" \
	"${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}" "${TORCHINDUCTOR_CACHE_DIR:-/tmp}" \
	"${TRITON_CACHE_DIR:-/tmp}" "${NEO_CACHE_DIR:-/tmp}" "${SYCL_CACHE_DIR:-/tmp}" \
	2>/dev/null || true

# The settings file lists ZE_AFFINITY_MASK empty (empty: the preset chooses the GPUs) and
# compose passes it on as set-but-empty; no runtime below should read "" as a GPU list.
[[ -n ${ZE_AFFINITY_MASK-} ]] || unset ZE_AFFINITY_MASK

# XPU: the server's user must open the GPU's render nodes, through the host's render group
# (compose group_add: RENDER_GID). Without it vLLM fails later with an unclear platform
# error; say which node, which GID and which groups instead. ARCVLLM_DRI_DIR: tests only.
check_render_nodes() {
	[[ ${VLLM_TARGET_DEVICE-} == xpu ]] || return 0
	local node gid
	for node in "${ARCVLLM_DRI_DIR:-/dev/dri}"/renderD*; do
		[[ -e $node ]] || continue
		[[ -r $node && -w $node ]] && continue
		gid=$(stat -c %g "$node")
		echo "arcvllm: cannot open $node (GID $gid) for read/write as uid $(id -u) with groups $(id -G): give the container GID $gid (compose: RENDER_GID=$gid; docker: --group-add $gid; Kubernetes: docs/deploy.md)" >&2
		exit 3
	done
}

# The API key from a file (compose: the api-key secret) into VLLM_API_KEY, which vLLM reads
# as its --api-key: in this process's environment only, never in an argument.
if [[ -n ${VLLM_API_KEY_FILE-} ]]; then
	if [[ ! -f $VLLM_API_KEY_FILE || ! -r $VLLM_API_KEY_FILE ]]; then
		echo "arcvllm-entrypoint: VLLM_API_KEY_FILE=$VLLM_API_KEY_FILE is not a readable file" >&2
		exit 3
	fi
	# The key rule, the same in docker/gateway-entrypoint.sh and arcvllm (options.KEY_RULE), with
	# the same words. `read -d ''` stops at a NUL byte (status 0) or at the end (status 1).
	if IFS= read -r -d '' VLLM_API_KEY <"$VLLM_API_KEY_FILE"; then VLLM_API_KEY=$'\n\n'; fi
	VLLM_API_KEY=${VLLM_API_KEY%$'\n'}
	# The characters spelled out: a range such as A-Z depends on the locale.
	key_chars=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~+/=-
	if [[ ! $VLLM_API_KEY =~ ^[$key_chars]{1,256}$ ]]; then
		echo "arcvllm-entrypoint: VLLM_API_KEY_FILE=$VLLM_API_KEY_FILE: the key file must be one line of 1 to 256 of the characters A-Z a-z 0-9 . _ ~ + / = - (make one: openssl rand -hex 32)" >&2
		exit 3
	fi
	export VLLM_API_KEY
fi

if [[ $# -eq 0 ]]; then
	set -- "${ARCVLLM_PRESET:?no arguments and no ARCVLLM_PRESET: give vLLM arguments or a preset}"
fi

case $1 in
-*)
	check_render_nodes
	exec python3 -m vllm.entrypoints.openai.api_server "$@"
	;;
esac

if [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] && ! command -v "$1" >/dev/null; then
	presets=$(python3 -c 'from arcvllm.paths import configs_dir; print(configs_dir() / "presets")' \
		2>/dev/null || true)
	if [[ -f $presets/$1.yaml || -f ${ARCVLLM_PRESETS_DIR:-/nonexistent}/$1.yaml ]]; then
		preset=$1
		shift
		check_render_nodes
		exec arcvllm serve --preset "$preset" -- "$@"
	fi
fi
exec "$@"

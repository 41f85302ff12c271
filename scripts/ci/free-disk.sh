#!/usr/bin/env bash
# free-disk.sh DIR...: room for one release build on a hosted runner, which guarantees only
# 14 GB free (one XPU image peaks near 25 GB). Empties each DIR: the runner's preinstalled
# toolchains (.NET, Android, GHC, the tool cache), which the job's container mounts from the
# runner's disk; prints the free space of the engine's data root before and after.
set -euo pipefail

root=${ARCVLLM_DOCKER_ROOT:-/var/lib/arcvllm-docker}
mkdir -p "$root"
room() { df --output=avail -BG "$root" | tail -n 1 | tr -dc 0-9; }
before=$(room)
for dir in "$@"; do
	[[ -d $dir ]] || continue
	find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
done
echo "free-disk: $before GB free on $root before, $(room) GB after emptying: $*"

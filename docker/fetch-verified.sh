#!/usr/bin/env bash
# fetch-verified.sh DIR SUMS URL...: download each URL into DIR and check it.
# SUMS is whitespace-separated "sha256 filename" pairs (configs/stacks.yaml, *_SHA256).
# An empty SUMS is allowed only for artifacts whose publisher gives no hash the build host
# could read: the sums are then printed so they can be recorded in the stacks file.
set -euo pipefail

dir=$1 sums=$2
shift 2
cd "$dir"
for url in "$@"; do
	curl -fsSL --retry 3 -o "$(basename "$url")" "$url"
done
if [[ -z $sums ]]; then
	echo "fetch-verified: no sha256 pinned; record these in configs/stacks.yaml:" >&2
	sha256sum -- * >&2
	exit 0
fi
# shellcheck disable=SC2086 # pairs are split on purpose
printf '%s  %s\n' $sums | sha256sum -c --strict -

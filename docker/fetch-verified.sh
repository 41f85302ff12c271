#!/usr/bin/env bash
# fetch-verified.sh DIR SUMS URL...: download each URL into DIR and check it.
# SUMS is whitespace-separated "sha256 filename" pairs (configs/stacks.yaml, *_SHA256).
# Every file must have a sum: an empty SUMS, or a file without one, is refused unless the
# operator sets ALLOW_UNVERIFIED=1 (the image's label then says so); the sums seen are
# printed either way so they can be checked against the publisher's and recorded.
set -euo pipefail

dir=$1 sums=$2
shift 2
cd "$dir"
for url in "$@"; do
	curl -fsSL --retry 3 -o "$(basename "$url")" "$url"
done
missing=()
for url in "$@"; do
	name=$(basename "$url")
	# shellcheck disable=SC2086 # pairs are split on purpose
	printf '%s %s\n' $sums | awk -v f="$name" '$2 == f {found = 1} END {exit !found}' ||
		missing+=("$name")
done
if ((${#missing[@]})); then
	echo "fetch-verified: no sha256 pinned for: ${missing[*]}; seen:" >&2
	(cd "$dir" && sha256sum -- "${missing[@]}") >&2
	if [[ ${ALLOW_UNVERIFIED:-0} != 1 ]]; then
		echo "fetch-verified: refusing unverified downloads (ALLOW_UNVERIFIED=1 to take them)" >&2
		exit 1
	fi
	echo "fetch-verified: ALLOW_UNVERIFIED=1: taking them unverified" >&2
fi
[[ -z $sums ]] && exit 0
# shellcheck disable=SC2086 # pairs are split on purpose
printf '%s  %s\n' $sums | sha256sum -c --strict --ignore-missing -

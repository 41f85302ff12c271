#!/usr/bin/env bash
# pin-sums-pr.sh TAG: after a release, the sha256 it recorded for the downloads no publisher
# sums (configs/stacks.yaml, changed by `arcvllm image sums STACK --write`) go to main by a
# pull request: committed on the branch pin-sums-TAG, pushed, and the pull request opened.
#
# Two rules of GitHub's decide what happens (docs/release.md):
# - a workflow's GITHUB_TOKEN may open a pull request only where the repository allows it
#   (Settings > Actions > General > "Allow GitHub Actions to create and approve pull
#   requests", off by default): when GitHub refuses, the branch stays pushed and the
#   compare URL that opens the pull request by hand is printed (a warning, not a failure:
#   the release itself is done);
# - a pull request opened with GITHUB_TOKEN starts no workflow: its CI runs once someone
#   pushes to the branch, or closes and reopens the pull request.
set -euo pipefail
cd "$(dirname "$0")/../.."

tag=${1:?usage: pin-sums-pr.sh TAG}
: "${GITHUB_REPOSITORY:?the repository, owner/name}"
server=${GITHUB_SERVER_URL:-https://github.com}
base=${PIN_SUMS_BASE:-main}

if git diff --quiet -- configs/stacks.yaml; then
	echo "pin-sums: every download was pinned already; no pull request"
	exit 0
fi
branch=pin-sums-$tag
git switch -q -c "$branch"
git add configs/stacks.yaml
git -c user.name=arcvllm-release -c user.email=release@arcvllm.invalid commit -q \
	-m "Pin the sha256 of the downloads release $tag fetched"
git push -q origin "$branch"
compare="$server/$GITHUB_REPOSITORY/compare/$base...$branch?expand=1"
body="The sha256 of every download without a published sum, as release $tag fetched it.
CI does not start by itself on a pull request the release workflow opens (GitHub's rule for
GITHUB_TOKEN): push to $branch, or close and reopen this pull request, to run it."
if said=$(gh pr create --base "$base" --head "$branch" --title "Pin the sums of $tag" \
	--body "$body" 2>&1); then
	echo "pin-sums: ${said##*$'\n'} (its CI starts once someone pushes to it, or closes and reopens it)"
else
	echo "::warning::pin-sums: GitHub opened no pull request (${said##*$'\n'}); the branch $branch is pushed: open it at $compare"
fi

#!/usr/bin/env bash
# `make tools`: the Debian tools the tests run, when missing from PATH: promtool and
# prometheus (deploy/prometheus), alertmanager (deploy/alertmanager), kubectl for
# `kubectl kustomize` (deploy/kubernetes). The engine, compose v2, buildx, cosign and the
# registry come with scripts/ci/engine.sh.
#
# One road for any user, root or not: the packages apt would install are downloaded with
# this machine's apt sources, pins and keyring (`apt-get download`: apt checks each .deb's
# sha256 against the signed index) into a private apt state under TOOLS_DIR, unpacked there
# with `dpkg-deb -x`, and linked into TOOLS_DIR/bin, which the Makefile puts on PATH (after
# the system's). Nothing under /etc, /usr or /var is written, no dpkg lock is taken.
# Settings (env): TOOLS_DIR (build/tools).
set -euo pipefail
cd "$(dirname "$0")/../.."

dir=${TOOLS_DIR:-$PWD/build/tools}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
export PATH=$PATH:$dir/bin

# tool -> the Debian package that ships it as /usr/bin/TOOL
declare -A package=([promtool]=prometheus [prometheus]=prometheus
	[prometheus-alertmanager]=prometheus-alertmanager [kubectl]=kubernetes-client)
missing=()
for tool in promtool prometheus prometheus-alertmanager kubectl; do
	command -v "$tool" >/dev/null && continue
	[[ " ${missing[*]} " == *" ${package[$tool]} "* ]] || missing+=("${package[$tool]}")
done
((${#missing[@]})) || exit 0
for need in apt-get dpkg-deb; do
	command -v "$need" >/dev/null || {
		echo "make tools: missing Debian packages ${missing[*]}, and no $need to fetch them: install them with your system's package manager" >&2
		exit 3
	}
done

state=$dir/apt
rm -rf "$state"
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs" "$dir/root" "$dir/bin"
opts=("-oDir::State::Lists=$state/lists" "-oDir::Cache=$state/cache")
# (as root apt would hand the download to its _apt user, which cannot write in a checkout)
[[ $(id -u) != 0 ]] || opts+=(-oAPT::Sandbox::User=root)
echo "make tools: fetching ${missing[*]} with this machine's apt sources into $dir"
apt-get "${opts[@]}" -qq update
(cd "$state/debs" && apt-get "${opts[@]}" -qq download "${missing[@]}")
for deb in "$state/debs"/*.deb; do
	dpkg-deb -x "$deb" "$dir/root"
	echo "make tools: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) sha256:$(sha256sum "$deb" | cut -d' ' -f1)"
done
for tool in "${!package[@]}"; do
	if [[ -x $dir/root/usr/bin/$tool ]]; then ln -sfn "../root/usr/bin/$tool" "$dir/bin/$tool"; fi
done
rm -rf "$state"
for tool in "${!package[@]}"; do
	command -v "$tool" >/dev/null || {
		echo "make tools: $tool is not in ${package[$tool]} as apt's sources have it" >&2
		exit 1
	}
done

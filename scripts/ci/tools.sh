#!/usr/bin/env bash
# `make tools`: the Debian tools the tests run, when missing from PATH: promtool and
# prometheus (deploy/prometheus), alertmanager and amtool (deploy/alertmanager), kubectl for
# `kubectl kustomize` (deploy/kubernetes). The engine, compose v2, buildx, cosign and the
# registry come with scripts/ci/engine.sh.
#
# Debian's prometheus and alertmanager read their web assets and default template at fixed
# paths under /usr/share (and /usr/share/javascript, from their libjs-* dependencies), so as
# root they are installed as apt installs them. Anything else (kubectl always; everything
# for a user without root) takes the road that writes no apt or dpkg file: the packages are
# downloaded with this machine's apt sources, pins and keyring (`apt-get download`: apt
# checks each .deb's sha256 against the signed index) into a private apt state under
# TOOLS_DIR, unpacked there with `dpkg-deb -x`, and their programs linked into
# TOOLS_DIR/bin, which the Makefile puts on PATH (after the system's). A user's unpacked
# prometheus and alertmanager run, without those assets: one line says which tests need
# the installed packages.
# On Debian kubectl is trixie's package of it (1.32, the release deploy/kubernetes is
# validated against): bookworm's kubernetes-client 1.20 carries kustomize v2, which builds
# none of the overlays. A host whose apt has no trixie source gets one at pin priority 100,
# for this download only (engine.sh adds the same to the system's when it installs).
# Settings (env): TOOLS_DIR (build/tools), ARCVLLM_OS_RELEASE (/etc/os-release).
set -euo pipefail
cd "$(dirname "$0")/../.."

dir=${TOOLS_DIR:-$PWD/build/tools}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
export PATH=$PATH:$dir/bin

debian=0
[[ $(sed -n 's/^ID=//p' "${ARCVLLM_OS_RELEASE:-/etc/os-release}" | tr -d '"') != debian ]] || debian=1
# tool -> the package that ships it as /usr/bin/TOOL
declare -A package=([promtool]=prometheus [prometheus]=prometheus [amtool]=prometheus-alertmanager
	[prometheus-alertmanager]=prometheus-alertmanager [kubectl]=kubernetes-client)
((debian == 0)) || package[kubectl]=kubectl
missing=()
for tool in promtool prometheus prometheus-alertmanager amtool kubectl; do
	command -v "$tool" >/dev/null && continue
	[[ " ${missing[*]} " == *" ${package[$tool]} "* ]] || missing+=("${package[$tool]}")
done
((${#missing[@]})) || exit 0
# As root, what reads files at fixed paths is installed; the rest is unpacked.
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
	system=()
	for pkg in "${missing[@]}"; do
		if [[ $pkg == prometheus* ]]; then system+=("$pkg"); fi
	done
	if ((${#system[@]})); then
		echo "make tools: installing ${system[*]} with apt (their assets live under /usr/share)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${system[@]}" >/dev/null
		# the tests start their own: not the daemons the packages enable under systemd
		if [[ -d /run/systemd/system ]]; then
			systemctl disable --now "${system[@]/%/.service}" >/dev/null 2>&1 || true
		fi
		missing=("${missing[@]/prometheus*/}")
		read -ra missing <<<"${missing[*]}"
		((${#missing[@]})) || exit 0
	fi
elif [[ " ${missing[*]} " == *" prometheus"* ]]; then
	echo "make tools: unpacked, Debian's prometheus and alertmanager lack their assets under /usr/share/prometheus: the console and Alertmanager delivery tests need the packages installed (as root: make tools)" >&2
fi
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
want=("${missing[@]}")
if ((debian)) && [[ " ${missing[*]} " == *" kubectl "* ]]; then
	want=("${want[@]/#kubectl/kubectl/trixie}")
	sources=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
		/etc/apt/sources.list 2>/dev/null || true)
	if ! grep -Eq '(^|[[:space:]])trixie([[:space:]]|$)' <<<"$sources"; then
		mirror=$(awk '/^URIs:/ {print $2; exit}' <<<"$sources")
		[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" {print $2; exit}' <<<"$sources")
		[[ -n $mirror ]] || {
			echo "make tools: no Debian mirror in apt's sources for trixie's kubectl" >&2
			exit 3
		}
		{
			cat /etc/apt/sources.list 2>/dev/null || true
			echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main"
		} >"$state/sources.list"
		printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >"$state/preferences"
		opts+=("-oDir::Etc::SourceList=$state/sources.list" "-oDir::Etc::Preferences=$state/preferences")
	fi
fi
# (as root apt would hand the download to its _apt user, which cannot write in a checkout)
[[ $(id -u) != 0 ]] || opts+=(-oAPT::Sandbox::User=root)
echo "make tools: fetching ${missing[*]} with this machine's apt sources into $dir"
apt-get "${opts[@]}" -qq update
(cd "$state/debs" && apt-get "${opts[@]}" -qq download "${want[@]}")
for deb in "$state/debs"/*.deb; do
	dpkg-deb -x "$deb" "$dir/root"
	echo "make tools: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) sha256:$(sha256sum "$deb" | cut -d' ' -f1)"
done
for tool in "$dir"/root/usr/bin/*; do
	if [[ -x $tool ]]; then ln -sfn "../root/usr/bin/${tool##*/}" "$dir/bin/${tool##*/}"; fi
done
rm -rf "$state"
for tool in "${!package[@]}"; do
	command -v "$tool" >/dev/null || {
		echo "make tools: $tool is not in ${package[$tool]} as apt's sources have it" >&2
		exit 1
	}
done

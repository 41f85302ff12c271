#!/usr/bin/env bash
# A Docker engine for building and testing the images on a bare CI machine.
#   engine.sh up          use the engine that answers (DOCKER_HOST's, ours, else the
#                         system's); none: on Debian as root install and start ours, elsewhere
#                         one line naming what to install; then import the Debian base image
#                         if absent; prints DOCKER_HOST=...
#   engine.sh down        stop dockerd, only if `up` started it (by its pidfile)
#   engine.sh run CMD...  up, run CMD with DOCKER_HOST and DOCKER (the client) exported,
#                         then stop what up started
#   engine.sh env         print the DOCKER_HOST line for this engine
#   engine.sh answers     exit 0 when this engine answers
# Settings (env): ARCVLLM_DOCKER_ROOT (data-root, outside the repo so layer caches survive;
# naming one is asking for an engine of our own on it: the system's is then not taken),
# ARCVLLM_DOCKER_RUN (socket, pidfile, exec-root), BASE_IMAGE (name the Dockerfile's FROM uses;
# none: an engine that only pulls), ARCVLLM_DOCKER_BRIDGE (none: no default bridge, for a
# second engine beside a running one; compose's own networks still work), DOCKER (the
# client; default /usr/bin/docker, else `docker` on PATH), ARCVLLM_OS_RELEASE (the
# os-release file read to tell Debian from the rest; tests).
#
# apt is touched only when no engine answers, on Debian, as root. An engine that already
# answers (a user in the docker group, a CI service) is used as it is: then only its
# client's buildx and compose plugins are checked, and a missing one is one line.
#
# The engine is Debian trixie's (stable): Docker 26.1 with BuildKit 0.13, buildx 0.13 and
# the compose v2 plugin, cosign and the distribution registry — the engine operators run
# (BuildKit, buildx, `docker compose`), in the suite with security support whose versions do
# not move from day to day (sid's do). Bookworm's 20.10 engine and compose 1.29 are past end
# of life, and its BuildKit drops the client session under load (moby/buildkit#2367). On a
# bookworm host trixie's source is added at pin priority 100: only these packages and the
# libraries they need (libc6 2.41 among them) come from it.
# The containerd image store is on: an image's ID is its manifest digest (what a registry
# and cosign see), and BuildKit's image exporter rewrites timestamps (reproducible builds).
set -euo pipefail

data_root=${ARCVLLM_DOCKER_ROOT:-/var/lib/arcvllm-docker}
run_dir=${ARCVLLM_DOCKER_RUN:-/run/arcvllm-docker}
base_image=${BASE_IMAGE:-debian:bookworm-slim}
suite=${BASE_SUITE:-bookworm}
socket=$run_dir/docker.sock
pidfile=$run_dir/dockerd.pid
owner=$run_dir/started-by-engine-sh
# Debian's client (BuildKit capable: secrets, mounts), the one the scripts it runs use: `run`
# exports it as DOCKER, which arcvllm's commands take too (arcvllm/docker.py).
docker=${DOCKER:-/usr/bin/docker}
[[ -x $docker ]] || docker=$(command -v docker || echo /usr/bin/docker)
os_release=${ARCVLLM_OS_RELEASE:-/etc/os-release}
# An engine the caller already points at (DOCKER_HOST) is used as is; else ours.
if [[ -n ${DOCKER_HOST:-} ]] && timeout 10 "$docker" version >/dev/null 2>&1; then
	theirs=1
else
	theirs=0
	export DOCKER_HOST=unix://$socket
fi
# A caller that names a data root wants an engine on it, not the system's.
own_engine=0
[[ -n ${ARCVLLM_DOCKER_ROOT:-} ]] && own_engine=1
# Set when this run started dockerd: only then does `run` stop it.
started=0

log() { echo "engine: $*" >&2; }

answers() { timeout 10 "$docker" version >/dev/null 2>&1; }

# Debian's mirror as this machine's apt has it (deb822 sources, or a one-line sources.list).
apt_mirror() {
	local mirror
	mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	if [[ -z $mirror ]]; then
		log "no Debian mirror in apt's sources (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list)"
		exit 3
	fi
	echo "$mirror"
}

engine_suite=trixie
engine_debs=(docker.io docker-cli docker-buildx docker-compose containerd runc iptables
	mmdebstrap cosign docker-registry skopeo)

# True when the installed engine is the suite's: dockerd, the client and both plugins.
engine_installed() {
	local tool
	for tool in dockerd mmdebstrap cosign docker-registry skopeo; do
		command -v "$tool" >/dev/null || return 1
	done
	[[ -x $docker ]] || return 1
	"$docker" buildx version >/dev/null 2>&1 && "$docker" compose version >/dev/null 2>&1 || return 1
	dpkg-query -W -f '${Version}' docker.io 2>/dev/null | grep -qv '^20\.'
}

# One field of os-release (ID, VERSION_CODENAME, PRETTY_NAME), unquoted; empty if absent.
os_field() {
	sed -n "s/^$1=//p" "$os_release" 2>/dev/null | head -n 1 | tr -d '"'
}

# The system's engine (DOCKER_HOST unset: the client's default context, e.g. a user in the
# docker group), when it answers: its address becomes DOCKER_HOST.
system_engine() {
	[[ $own_engine == 0 ]] || return 1
	env -u DOCKER_HOST timeout 10 "$docker" version >/dev/null 2>&1 || return 1
	local host
	host=$(env -u DOCKER_HOST "$docker" context inspect --format '{{.Endpoints.docker.Host}}' 2>/dev/null || true)
	export DOCKER_HOST=${host:-unix:///var/run/docker.sock}
	theirs=1
}

# No engine answers: install ours, on Debian as root only; anywhere else one line naming
# what to install (apt is never touched there: another distribution's sources and keyring
# are not Debian's).
install_engine() {
	if [[ $(id -u) != 0 ]]; then
		log "no Docker engine answers: start the one you use (a user in the docker group needs nothing more; DOCKER_HOST names another), or run this as root to install and start Debian's"
		exit 3
	fi
	engine_installed && return
	local id name codename
	id=$(os_field ID)
	name=$(os_field PRETTY_NAME)
	if [[ $id != debian ]]; then
		log "no Docker engine answers and this is ${name:-not Debian}, not Debian (engine.sh installs Debian's packages only): install Docker Engine with its buildx and compose plugins (https://docs.docker.com/engine/install/), or start the one installed, then run this again"
		exit 3
	fi
	codename=$(os_field VERSION_CODENAME)
	if [[ $codename != "$engine_suite" && $codename != forky && $codename != sid ]]; then
		log "adding Debian $engine_suite's source at pin priority 100 (only the engine comes from it)"
		printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
			"$(apt_mirror)" "$engine_suite" >/etc/apt/sources.list.d/arcvllm-engine.sources
		printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n' "$engine_suite" \
			>/etc/apt/preferences.d/arcvllm-engine
	fi
	log "installing ${engine_debs[*]} from $engine_suite"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		-t "$engine_suite" "${engine_debs[@]}" >/dev/null
}

# What the images' builds and compose need of the client, whichever engine answers.
check_plugins() {
	local missing=()
	"$docker" buildx version >/dev/null 2>&1 || missing+=(buildx)
	"$docker" compose version >/dev/null 2>&1 || missing+=(compose)
	((${#missing[@]} == 0)) && return
	log "the Docker client $docker has no ${missing[*]} plugin: install docker-buildx and docker-compose v2 (Debian: docker-buildx docker-compose; Docker's own packages: docker-buildx-plugin docker-compose-plugin)"
	exit 3
}

start_engine() {
	[[ $theirs == 1 ]] && return
	answers && return
	system_engine && return
	install_engine
	mkdir -p "$run_dir" "$data_root"
	log "starting dockerd (data-root $data_root, socket $socket)"
	printf '{"features": {"containerd-snapshotter": true}}\n' >"$run_dir/daemon.json"
	# shellcheck disable=SC2046 # no bridge flag, or one
	nohup "$(command -v dockerd)" --config-file "$run_dir/daemon.json" --data-root "$data_root" \
		$([[ -n ${ARCVLLM_DOCKER_BRIDGE:-} ]] && echo "--bridge=$ARCVLLM_DOCKER_BRIDGE") \
		--exec-root "$run_dir/exec" --pidfile "$pidfile" -H "$DOCKER_HOST" \
		>"$run_dir/dockerd.log" 2>&1 &
	echo $! >"$owner"
	started=1
	for _ in $(seq 60); do
		answers && return
		sleep 1
	done
	log "dockerd did not answer within 60 s; see $run_dir/dockerd.log"
	exit 1
}

# No registry here: build the base image from Debian's own packages when it is absent. The
# same suite state gives the same bytes on any machine and any day: mmdebstrap writes the
# tar itself (sorted, numeric owners, every mtime clamped to SOURCE_DATE_EPOCH), and that
# epoch is the suite's own Release date (a point release's: it moves only with the next
# point release); the host's apt snippets and sources go in by mmdebstrap's hooks, so they
# are in that tar too. `docker import` keeps the tar as the layer (its diff_id is the tar's
# sha256). docs/release.md says what this holds and what it does not.
ensure_base_image() {
	[[ $base_image == none ]] && return # an engine that only pulls (release-check.sh)
	"$docker" image inspect "$base_image" >/dev/null 2>&1 && return
	"$docker" pull -q "$base_image" >/dev/null 2>&1 && return
	if ! command -v mmdebstrap >/dev/null; then
		log "no $base_image on this engine, none to pull, and no mmdebstrap to make it: install mmdebstrap, or load a Debian $suite image and tag it $base_image"
		exit 3
	fi
	local mirror tar released epoch
	mirror=$(apt_mirror)
	released=$(curl -fsS --max-time 60 "$mirror/dists/$suite/Release" | sed -n 's/^Date: //p')
	if [[ -z $released ]] || ! epoch=$(date -u -d "$released" +%s); then
		log "no Date in $mirror/dists/$suite/Release: cannot date the base image"
		exit 3
	fi
	mkdir -p "$run_dir"
	tar=$(mktemp "${TMPDIR:-/tmp}/arcvllm-base.XXXXXX.tar")
	# shellcheck disable=SC2064 # expand now: the path is local
	trap "rm -f '$tar'" EXIT
	log "making $base_image with mmdebstrap from $mirror ($suite of $released)"
	# apt as this host configures it (its 99* snippets: a mirror's settings, e.g. a frozen
	# snapshot's Check-Valid-Until), for mmdebstrap and, by the hooks, in the image
	local opts=() snippet
	for snippet in /etc/apt/apt.conf.d/99*; do
		[[ -f $snippet ]] && opts+=("--aptopt=$snippet")
	done
	local sources=/etc/apt/sources.list.d/debian.sources
	# shellcheck disable=SC2016 # $1 is the hooks' own: mmdebstrap's root, in their shell
	SOURCE_DATE_EPOCH=$epoch mmdebstrap --quiet --variant=minbase "${opts[@]}" \
		--customize-hook='rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap"' \
		--customize-hook='for f in /etc/apt/apt.conf.d/99*; do [ ! -f "$f" ] || cp "$f" "$1/etc/apt/apt.conf.d/"; done' \
		--customize-hook="if [ -f $sources ]; then cp $sources \"\$1/etc/apt/sources.list.d/\"; rm -f \"\$1/etc/apt/sources.list\"; fi" \
		--customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
		"$suite" "$tar" "$mirror" >"$run_dir/mmdebstrap.log" 2>&1
	"$docker" import - "$base_image" <"$tar" >/dev/null
	log "$base_image: layer sha256:$(sha256sum "$tar" | cut -d' ' -f1)"
	rm -f "$tar"
	trap - EXIT
}

up() {
	start_engine
	check_plugins
	ensure_base_image
	echo "DOCKER_HOST=$DOCKER_HOST"
}

down() {
	[[ -f $owner ]] || return 0
	local pid
	pid=$(cat "$owner")
	rm -f "$owner"
	kill -0 "$pid" 2>/dev/null || return 0
	log "stopping dockerd (pid $pid)"
	kill "$pid"
	for _ in $(seq 30); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 1
	done
	kill -9 "$pid" 2>/dev/null || true
}

case ${1:-} in
up) up ;;
down) down ;;
env)
	answers || system_engine || true
	echo "DOCKER_HOST=$DOCKER_HOST"
	;;
answers) answers ;;
run)
	shift
	[[ $# -gt 0 ]] || { log "usage: engine.sh run CMD..."; exit 2; }
	start=$SECONDS
	up >/dev/null
	log "ready in $((SECONDS - start)) s"
	if [[ $started == 1 ]]; then trap down EXIT; fi
	DOCKER=$docker "$@"
	;;
*)
	echo "usage: engine.sh up|down|env|answers|run CMD..." >&2
	exit 2
	;;
esac

#!/usr/bin/env bash
# A local OCI registry for the release rehearsal: Debian's docker-registry (distribution
# 2.8), plain http on loopback (Docker and cosign allow http to 127.0.0.1 by default / with
# --allow-http-registry), its storage under build/registry.
#   registry.sh up     start it if it does not answer; prints REGISTRY=127.0.0.1:PORT
#   registry.sh down   stop it, only if `up` started it (by its pidfile)
# Settings (env): REGISTRY_PORT (5000), REGISTRY_DIR (build/registry).
set -euo pipefail
cd "$(dirname "$0")/../.."

port=${REGISTRY_PORT:-5000}
dir=${REGISTRY_DIR:-$PWD/build/registry}
pidfile=$dir/registry.pid
address=127.0.0.1:$port

answers() { curl -fsS -o /dev/null "http://$address/v2/" 2>/dev/null; }

up() {
	if answers; then
		# Ours (its pidfile, a live process): reused. Anything else there holds another
		# checkout's images, or an operator's.
		if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
			echo "REGISTRY=$address"
			return
		fi
		echo "registry: $address answers but is not the registry of $dir (REGISTRY_PORT=N for another port)" >&2
		exit 3
	fi
	command -v docker-registry >/dev/null || {
		echo "registry: no docker-registry (scripts/ci/engine.sh up installs it)" >&2
		exit 3
	}
	mkdir -p "$dir/data"
	cat >"$dir/config.yml" <<CONFIG
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $dir/data}
  delete: {enabled: true}
http: {addr: $address}
CONFIG
	nohup docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
	echo $! >"$pidfile"
	for _ in $(seq 30); do
		if answers; then
			echo "REGISTRY=$address"
			return
		fi
		sleep 1
	done
	echo "registry: no answer on $address within 30 s; see $dir/registry.log" >&2
	exit 1
}

down() {
	[[ -f $pidfile ]] || return 0
	local pid
	pid=$(cat "$pidfile")
	rm -f "$pidfile"
	kill "$pid" 2>/dev/null || true
}

case ${1:-} in
up) up ;;
down) down ;;
*)
	echo "usage: registry.sh up|down" >&2
	exit 2
	;;
esac

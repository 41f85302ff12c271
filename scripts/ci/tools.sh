#!/usr/bin/env bash
# `make tools`: the Debian tools the tests run, installed when missing (as root): promtool
# and prometheus (deploy/prometheus), alertmanager (deploy/alertmanager), kubectl for
# `kubectl kustomize` (deploy/kubernetes). The engine, compose v2, buildx, cosign and the
# registry come with scripts/ci/engine.sh.
set -euo pipefail

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]]; then
	echo "make tools: missing Debian packages: ${missing[*]} (apt-get install them as root)" >&2
	exit 3
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# CI's release, the operator's `make release` into a registry on this machine: the CPU
# stack and every side image built reproducibly, pushed, signed with a key pair made here
# (the hosted workflow signs keyless), their SBOMs attested; then the CPU image built once
# more with no cache, whose digest must be the release's (both printed; on a difference the
# files that differ are named). Runs on the pipeline's engine; the registry stays up for
# scripts/ci/release-check.sh, which pulls and verifies on a clean engine.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${RELEASE_DIR:-$PWD/build/release/ci}
keys=$PWD/build/release/keys
registry=$(scripts/ci/registry.sh up)
registry=${registry#REGISTRY=}
mkdir -p "$keys" "$out"
if [[ ! -f $keys/cosign.key ]]; then
	(umask 077 && openssl rand -hex 16 >"$keys/password")
	COSIGN_PASSWORD=$(<"$keys/password") cosign generate-key-pair \
		--output-key-prefix "$keys/cosign" >/dev/null
fi
COSIGN_PASSWORD=$(<"$keys/password")
# The registry is on this machine: layers go uncompressed (compressing the CPU image's
# twice costs ~12 min of these 2 cores; a release for a real registry takes zstd).
ARCVLLM_LAYER_COMPRESSION=${ARCVLLM_LAYER_COMPRESSION:-uncompressed}
export COSIGN_PASSWORD ARCVLLM_LAYER_COMPRESSION
make --no-print-directory release VERSION=ci REGISTRY="$registry" RELEASE_STACKS=cpu \
	COSIGN_KEY="$keys/cosign.key" RELEASE_OUT="$out"
# The side images' archives are in the registry now (one copy on disk is enough).
find "$out" -name '*.oci.tar' ! -name 'arcvllm-cpu-*' -delete

# The same commit again on a clean builder (no cache): the same digest, or the files that
# differ named. (Reported, not yet a failure: docs/release.md says what still differs.)
trap 'rm -f "$out"/*.oci.tar' EXIT
released=$(.venv/bin/python -c 'import json, sys; m = json.load(open(sys.argv[1])); print(next(e["digest"] for e in m["images"] if e["name"] == "cpu"))' "$out/manifest.json")
.venv/bin/arcvllm image build cpu --tag arcvllm:cpu-rebuilt --oci-archive "$out/cpu-rebuilt.oci.tar" \
	--docker-flags=--no-cache >"$out/rebuild.log" 2>&1 || { tail -n 50 "$out/rebuild.log"; exit 1; }
if .venv/bin/arcvllm release compare "$out/arcvllm-cpu-ci.oci.tar" "$out/cpu-rebuilt.oci.tar" \
	--limit 60 | tee "$out/reproducible.txt"; then
	echo "release-rehearsal: reproducible: cpu $released, rebuilt with no cache: the same digest"
else
	echo "release-rehearsal: NOT reproducible yet: the CPU image rebuilt with no cache differs (files above, $out/reproducible.txt)"
fi

#!/usr/bin/env bash
# CI's release, the operator's `make release` into a registry on this machine: the CPU
# stack and every side image built reproducibly, pushed, signed with a key pair made here
# (the hosted workflow signs keyless), their SBOMs attested. Runs on the pipeline's engine;
# the registry stays up for scripts/ci/release-check.sh, which pulls and verifies on a
# clean engine.
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
# The layouts are in the registry now; the CPU image's and the router's (the manifest names
# them) are the first of the two clean builds `make reproducible REPRO_BUILDS=2` compares
# (pipeline.sh): one more clean build each, not two.
repro=${REPRO_OUT:-$PWD/build/reproducible}
mkdir -p "$repro"
for image in cpu router; do
	layout=$(.venv/bin/arcvllm release entry "$out/manifest.json" "$image" layout)
	rm -rf "${repro:?}/$image-1"
	mv "$out/$layout" "$repro/$image-1"
done
rm -rf "$out"/*.oci
echo "release-rehearsal: $(grep -c '"ref"' "$out/manifest.json") images pushed, signed and attested ($out/manifest.json)"

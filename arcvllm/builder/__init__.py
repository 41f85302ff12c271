"""Build host: what makes the images and holds the pins to the releases' own files
(locks, the package index and the stacks it resolves, kernels and toolchain evidence, the
audit against a release's Dockerfile.xpu, image builds, releases, SBOMs, the tiny model).
Runs where `make build` / `make release` run; the SBOM and the tiny model also run inside
a build stage of docker/Dockerfile.
"""

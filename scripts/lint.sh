#!/usr/bin/env bash
# `make lint`: the linters of the tooling venv, each over what it reads: ruff (lint and
# format) over the package and the tests, shellcheck over the scripts, hadolint over the
# Dockerfile, actionlint over the workflows, mypy over the package (pyproject.toml). Stops at
# the first that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${VENV:-.venv}/bin
set -x
"$bin/ruff" check arcvllm tests
"$bin/ruff" format --check arcvllm tests
"$bin/mypy"
"$bin/shellcheck" scripts/*.sh scripts/ci/*.sh docker/*.sh .ci/run
"$bin/hadolint" docker/Dockerfile
"$bin/actionlint" .github/workflows/*.yml

#!/usr/bin/env bash
# The pre-commit hooks' command (.pre-commit-config.yaml): `scripts/venv-tool.sh TOOL ARGS...`
# runs TOOL of the tooling venv (VENV, default .venv: `make venv`), with the venv's tools
# first on PATH (actionlint finds shellcheck there), so a commit needs no activated venv.
set -euo pipefail
bin=${VENV:-.venv}/bin
tool=${1:?usage: scripts/venv-tool.sh TOOL [ARGS...]}
shift
[[ -x $bin/$tool ]] || { echo "no $bin/$tool: run make venv" >&2; exit 1; }
PATH=$(cd "$bin" && pwd):$PATH exec "$bin/$tool" "$@"

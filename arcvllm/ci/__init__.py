"""CI only, never in the product wheel (pyproject.toml excludes it): the stand-ins for
what the XPU build cannot reach on a CI host (arcvllm/ci/standins.yaml), made by
scripts/ci/standins.sh.
"""

"""The vLLM patch series: the series file, applying and verifying patches against a
vLLM tree, and the behavioural probes. Runs at image build time (the `patch` stage) and
wherever a vLLM release's Python is (the image, the test venvs).
"""

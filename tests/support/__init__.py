"""What the test modules share, so that no test module imports another: the Docker engine
and the CPU image (`engine`, registered as fixtures by conftest.py), the entrypoint on the
host, compose and the scale-out files, a fake GPU host, a fake vLLM server, Prometheus's
files, a patched vLLM overlay, and CI-side checks that are not the product's (`wheels`)."""

from pathlib import Path

# The checkout's root: the one place the tests find it.
ROOT = Path(__file__).resolve().parent.parent.parent

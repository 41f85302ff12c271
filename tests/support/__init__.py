"""What the tests share beyond conftest's fixtures: CI-side checks that are not part of the
product (`wheels`: what a pinned kernels wheel says about its stack)."""

"""What runs in the image next to vLLM: `arcvllm serve` (a preset to vLLM's own
server) and the two vLLM plugins the package registers (the high-address emulation, the
CPU stand-ins for two Triton kernels).
"""

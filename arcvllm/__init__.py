"""arcvllm: a vLLM serving distribution for Intel Arc Pro B70 GPUs."""

__version__ = "0.1.0"

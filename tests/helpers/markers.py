"""RunIf-style skip markers: a test that needs hardware or a package this machine lacks is skipped, and the reason
names what is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False here)"
)
requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="needs vLLM (`pip install vllm` on a GPU machine; not installed here)",
)

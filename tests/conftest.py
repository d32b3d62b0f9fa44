"""Suite-wide test settings: GPU tests skip cleanly on machines without CUDA; runs stay offline."""

from __future__ import annotations

import os

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The Ray tests take minutes each: start them first, so that the other pytest-xdist worker
    # takes the rest of the suite meanwhile.
    items.sort(key=lambda item: item.get_closest_marker("ray") is None)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _has_cuda():  # import torch only when a GPU test was collected
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked `gpu`)")
    for item in gpu_items:
        item.add_marker(skip)

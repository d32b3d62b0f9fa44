"""Suite-wide test settings: GPU tests skip cleanly on machines without CUDA; runs stay offline."""

from __future__ import annotations

import os
import tempfile

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The start-of-run validation cache (seal.local.validation_cache): the suite's runs keep their own,
# so that no test reads an entry a developer's runs wrote.
os.environ.setdefault("SEAL_VALIDATION_CACHE", tempfile.mkdtemp(prefix="seal-validation-cache-"))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-sabotage", action="store_true",
                     help="also run the `sabotage` tests: each breaks a path on purpose to show that another "
                          "test then fails (minutes each, so not part of the default run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-sabotage"):
        proof = pytest.mark.skip(reason="a proof of another test's sensitivity: run with --run-sabotage")
        for item in items:
            if "sabotage" in item.keywords:
                item.add_marker(proof)
    # The Ray tests take minutes each: start them first, so that the other pytest-xdist worker
    # takes the rest of the suite meanwhile.
    items.sort(key=lambda item: item.get_closest_marker("ray") is None)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _has_cuda():  # import torch only when a GPU test was collected
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked `gpu`)")
    for item in gpu_items:
        item.add_marker(skip)

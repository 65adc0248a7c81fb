"""`envvars.told_to`: the variables told to one framework in particular, which the status lists under
JAX and PyTorch (`Controller.other_frameworks`) and the selftest's JAX and PyTorch children note; and
the selftest reading PyTorch's allocator backend as PyTorch splits its configuration."""

from __future__ import annotations

import pytest

from tfgpu_magic.envvars import (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, EVERY_FRAMEWORK, PYTORCH_ALLOC_CONF,
                                 PYTORCH_CUDA_ALLOC_CONF, TABLE, TF_GPU_ALLOCATOR, XLA_PYTHON_CLIENT_PREALLOCATE,
                                 told_to)
from tfgpu_magic.gpus.inventory import Inventory
from tfgpu_magic.selftest.judges import _names_async
from tfgpu_magic.selftest.rules import RULES, Machine


def test_each_framework_is_told_its_own_variables_in_the_tables_order() -> None:
    """CUDA's own variables (read by every framework) are told to none in particular; a variable two
    frameworks read (`TF_GPU_ALLOCATOR`: TensorFlow and JAX's XLA) is told to both."""
    assert told_to("torch") == (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF)
    jax = told_to("jax")
    assert jax[:2] == (TF_GPU_ALLOCATOR, XLA_PYTHON_CLIENT_PREALLOCATE) and TF_GPU_ALLOCATOR in told_to("tensorflow")
    for framework in EVERY_FRAMEWORK:
        assert not {CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER} & set(told_to(framework))
        order = [var.name for var in TABLE]
        assert list(told_to(framework)) == sorted(told_to(framework), key=order.index)
    assert told_to("keras") == ()


@pytest.mark.parametrize("name, framework", [("jax-settings", "jax"), ("torch-settings", "torch")])
def test_the_selftest_child_notes_the_variables_told_to_its_framework(name: str, framework: str) -> None:
    rule = next(rule for rule in RULES if rule.name == name)
    prepared = rule.prepare(Machine({}, Inventory(error="no NVML here")))
    assert prepared.args["variables"] == list(told_to(framework))


@pytest.mark.parametrize("conf, picks", [
    ("backend:cudaMallocAsync", True),
    ("expandable_segments:True,backend:cudaMallocAsync", True),
    (" backend : cudaMallocAsync ", True),  # PyTorch drops the spaces: still its async backend
    ("roundup_power2_divisions:[256:1,512:2],backend:cudaMallocAsync", True),
    ("backend:native", False),
    ("expandable_segments:True", False),
    ("", False),
    (None, False),
])
def test_the_selftest_reads_the_allocator_backend_as_pytorch_splits_it(conf: str | None, picks: bool) -> None:
    assert _names_async(conf) is picks

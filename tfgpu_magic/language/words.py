"""The closed word sets shared by the policy and the directive registry.

A leaf module without imports, so that the registry (read to build `%tfgpu?`)
needs neither the policy module nor anything else."""

from __future__ import annotations

ALL_GPUS = "all"
"""Key in `Policy.limits` for 'every visible GPU'."""

ALLOCATORS = {"bfc": None, "async": "cuda_malloc_async"}
"""Allocator names of the grammar and the `TF_GPU_ALLOCATOR` value each one sets (None: unset)."""

LOGLEVELS = ("debug", "info", "warning", "error")
"""Lowest log severity still shown, mildest first (`Policy.loglevel`; None: TensorFlow's default)."""

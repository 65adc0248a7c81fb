"""The environment variables this tool sets: who reads each one, and when (pure).

A variable only takes effect if it is set before its reader reads it; after that moment a change is
reported as locked. The moment decides when, not the name: the runtime compares it with TensorFlow's
state (`RuntimeState.passed`).
"""

from __future__ import annotations

from typing import NamedTuple


class Moment(NamedTuple):
    """When a reader reads its variables, once per process. `code` is why a change made after this
    moment no longer takes effect (a `tf.apply.LockReason`; `views.status` words it)."""

    code: str
    name: str


IMPORT = Moment("import", "TensorFlow import")
CUDA_START = Moment("cuda_start", "CUDA start (TensorFlow's first device listing)")
ALLOCATOR_CREATION = Moment("allocator_creation", "GPU allocator creation")
MOMENTS = (IMPORT, CUDA_START, ALLOCATOR_CREATION)


class EnvVar(NamedTuple):
    name: str
    reader: str
    read_at: Moment
    meaning: str


CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
TF_GPU_ALLOCATOR = "TF_GPU_ALLOCATOR"
TF_FORCE_GPU_ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"

TABLE = (
    EnvVar(CUDA_DEVICE_ORDER, "the CUDA driver (cuInit)", CUDA_START,
           "PCI_BUS_ID numbers GPUs as nvidia-smi does (CUDA's default: fastest first)"),
    EnvVar(CUDA_VISIBLE_DEVICES, "the CUDA driver (cuInit)", CUDA_START,
           "the GPUs CUDA enumerates, in this order (indices or UUIDs; empty hides all)"),
    EnvVar(TF_GPU_ALLOCATOR, "TensorFlow's GPUProcessState (GetGPUAllocator)", ALLOCATOR_CREATION,
           "cuda_malloc_async replaces the BFC allocator with CUDA's stream-ordered pool"),
    EnvVar(TF_FORCE_GPU_ALLOW_GROWTH, "TensorFlow's GPU BFC allocator (GetAllowGrowthValue)", ALLOCATOR_CREATION,
           "true/false: memory growth for every GPU allocator, over the tf.config setting"),
    EnvVar(TF_CPP_MIN_LOG_LEVEL, "TensorFlow's C++ logging (tsl/absl)", IMPORT,
           "lowest C++ log severity shown: 0 info, 1 warning, 2 error, 3 fatal"),
)
"""Every variable this tool may set, in the order it sets them; `reset` restores them all."""

BY_NAME = {var.name: var for var in TABLE}
NAMES = tuple(var.name for var in TABLE)

CPP_LOG_LEVEL = {"debug": "0", "info": "0", "warning": "1", "error": "2"}
"""`TF_CPP_MIN_LOG_LEVEL` for each `loglevel`. C++ has no level below info: the VLOG switch
(`TF_CPP_MAX_VLOG_LEVEL`) is per-module developer tracing, not a severity, so debug adds only the
Python side."""


def read_at(name: str) -> Moment:
    """When `name`'s reader reads it; `KeyError` for a variable outside the table."""
    return BY_NAME[name].read_at

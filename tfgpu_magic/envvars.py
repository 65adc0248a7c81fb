"""The environment variables this tool sets, for every framework in the kernel: who reads each one, and
when (pure).

A variable only takes effect if it is set before its reader reads it; after that moment a change is
reported as locked. The moment decides when, not the name: the runtime compares it with the frameworks'
state (`RuntimeState.passed`). A variable read by two frameworks (`TF_GPU_ALLOCATOR`: TensorFlow and
JAX's XLA) has both moments; the first that passed makes a change too late.
"""

from __future__ import annotations

from typing import NamedTuple


class Moment(NamedTuple):
    """When a reader reads its variables, once per process. `code` is why a change made after this
    moment no longer takes effect (a `tf.apply.LockReason`; `views.status` words it)."""

    code: str
    name: str


IMPORT = Moment("import", "TensorFlow import")
CUDA_START = Moment("cuda_start", "CUDA start (any framework's first device listing)")
ALLOCATOR_CREATION = Moment("allocator_creation", "TensorFlow's GPU allocator creation")
JAX_BACKENDS = Moment("jax_backends", "JAX's backend start (its first op or device listing)")
TORCH_CUDA = Moment("torch_cuda", "PyTorch's CUDA start (its first CUDA call)")
TORCH_IMPORT = Moment("torch_import", "PyTorch's import (its CUDA library picks the allocator backend as it loads)")
MOMENTS = (IMPORT, CUDA_START, ALLOCATOR_CREATION, JAX_BACKENDS, TORCH_CUDA, TORCH_IMPORT)


EVERY_FRAMEWORK = ("tensorflow", "jax", "torch")
"""The frameworks whose variables this tool sets; all of them read CUDA's own."""


class EnvVar(NamedTuple):
    name: str
    reader: str
    read_at: tuple[Moment, ...]
    meaning: str
    frameworks: tuple[str, ...] = ("tensorflow",)
    """Which frameworks read it (`tensorflow`, `jax`, `torch`; `EVERY_FRAMEWORK` for CUDA's)."""


CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
TF_GPU_ALLOCATOR = "TF_GPU_ALLOCATOR"
TF_FORCE_GPU_ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
XLA_PYTHON_CLIENT_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
XLA_CLIENT_MEM_FRACTION = "XLA_CLIENT_MEM_FRACTION"
XLA_PYTHON_CLIENT_MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
"""The older name of `XLA_CLIENT_MEM_FRACTION`; jaxlib raises where both are set (`xla_client.py`,
`generate_pjrt_gpu_plugin_options`), so the plan sets one of them (`frameworks.jax.fraction_variable`)."""
PYTORCH_CUDA_ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
PYTORCH_ALLOC_CONF = "PYTORCH_ALLOC_CONF"
"""The newer name of `PYTORCH_CUDA_ALLOC_CONF`; both are set (pytorch#183387: 2.9.1 honoured some keys
only under the old one; 2.13 reads the old one first). The backend in them is picked as torch's CUDA
library loads, at `import torch` (`BackendStaticInitializer`, c10/cuda/CUDACachingAllocator.cpp), and a
different one set later fails PyTorch's first CUDA call (pytorch#104801): they are read at its import."""

SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_GPUS = "SLURM_STEP_GPUS"
"""Slurm's global GPU IDs (gres.conf's `/dev/nvidiaN` numbers) of a job step's GPUs, never relative to a
device cgroup (srun(1), OUTPUT ENVIRONMENT VARIABLES). Read only, never set (`gpus.slurm`)."""
SLURM_JOB_GPUS = "SLURM_JOB_GPUS"
"""The same for a batch or interactive job's own step (sbatch(1), salloc(1))."""
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
"""How many GPUs the step has on this node (srun(1), sbatch(1))."""
SLURM_SUBMIT_HOST = "SLURM_SUBMIT_HOST"
"""Where sbatch ran (sbatch(1), OUTPUT ENVIRONMENT VARIABLES): a kernel's job binds the node's address
on the route to it (`jupyter.slurm_job`). Read only."""
SLURM_CONF = "SLURM_CONF"
"""The Slurm configuration file, which names the cluster: kept in a kernel job's environment."""
TFGPU_MAGIC_SLURM_SUBMITTED = "TFGPU_MAGIC_SLURM_SUBMITTED"
"""When the Slurm provisioner submitted a kernel's job (seconds since the epoch), for the kernel's note on
its wait in the queue (`jupyter.slurm_job`)."""
KERNEL_LAUNCH_TIMEOUT = "KERNEL_LAUNCH_TIMEOUT"
"""Enterprise Gateway's name for the seconds a kernel may take to start; the Slurm provisioner reads it
from the launch environment."""
JPY_PARENT_PID = "JPY_PARENT_PID"
"""The pid jupyter_client's launcher tells a kernel to watch (ipykernel exits when it ends): left out of
a Slurm job's environment, where it would name a process of another host."""

TABLE = (
    EnvVar(CUDA_DEVICE_ORDER, "the CUDA driver (cuInit)", (CUDA_START,),
           "PCI_BUS_ID numbers GPUs as nvidia-smi does (CUDA's default: fastest first)", EVERY_FRAMEWORK),
    EnvVar(CUDA_VISIBLE_DEVICES, "the CUDA driver (cuInit)", (CUDA_START,),
           "the GPUs CUDA enumerates, in this order (indices or UUIDs; empty hides all)", EVERY_FRAMEWORK),
    EnvVar(TF_GPU_ALLOCATOR, "TensorFlow's GPUProcessState (GetGPUAllocator); JAX's XLA GPU client",
           (ALLOCATOR_CREATION, JAX_BACKENDS),
           "cuda_malloc_async replaces the BFC allocator with CUDA's stream-ordered pool", ("tensorflow", "jax")),
    EnvVar(TF_FORCE_GPU_ALLOW_GROWTH, "TensorFlow's GPU BFC allocator (GetAllowGrowthValue)", (ALLOCATOR_CREATION,),
           "true/false: memory growth for every GPU allocator, over the tf.config setting"),
    EnvVar(TF_CPP_MIN_LOG_LEVEL, "TensorFlow's C++ logging (tsl/absl)", (IMPORT,),
           "lowest C++ log severity shown: 0 info, 1 warning, 2 error, 3 fatal"),
    EnvVar(XLA_PYTHON_CLIENT_PREALLOCATE, "JAX (jaxlib's generate_pjrt_gpu_plugin_options)", (JAX_BACKENDS,),
           "false: JAX allocates as needed instead of taking 75% of each GPU at its first op", ("jax",)),
    EnvVar(XLA_CLIENT_MEM_FRACTION, "JAX (jaxlib's generate_pjrt_gpu_plugin_options)", (JAX_BACKENDS,),
           "the share of each GPU's total memory JAX's allocator may take", ("jax",)),
    EnvVar(XLA_PYTHON_CLIENT_MEM_FRACTION, "JAX (older jaxlib; read when XLA_CLIENT_MEM_FRACTION is not set)",
           (JAX_BACKENDS,), "the share of each GPU's total memory JAX's allocator may take", ("jax",)),
    EnvVar(PYTORCH_CUDA_ALLOC_CONF, "PyTorch's CUDA caching allocator (BackendStaticInitializer at import; "
           "CUDAAllocatorConfig)", (TORCH_IMPORT,),
           "backend:cudaMallocAsync replaces the caching allocator with CUDA's stream-ordered pool", ("torch",)),
    EnvVar(PYTORCH_ALLOC_CONF, "PyTorch's CUDA caching allocator (read where PYTORCH_CUDA_ALLOC_CONF is unset)",
           (TORCH_IMPORT,),
           "the newer name of PYTORCH_CUDA_ALLOC_CONF", ("torch",)),
)
"""Every variable this tool may set, in the order it sets them; `reset` restores them all."""

BY_NAME = {var.name: var for var in TABLE}
NAMES = tuple(var.name for var in TABLE)

CPP_LOG_LEVEL = {"debug": "0", "info": "0", "warning": "1", "error": "2"}
"""`TF_CPP_MIN_LOG_LEVEL` for each `loglevel`. C++ has no level below info: the VLOG switch
(`TF_CPP_MAX_VLOG_LEVEL`) is per-module developer tracing, not a severity, so debug adds only the
Python side."""


def read_at(name: str) -> tuple[Moment, ...]:
    """When `name`'s readers read it; `KeyError` for a variable outside the table."""
    return BY_NAME[name].read_at


def told_to(framework: str) -> tuple[str, ...]:
    """The variables told to `framework` in particular (`tensorflow`, `jax` or `torch`), in `TABLE`'s
    order: those it reads, less CUDA's own, which every framework reads (what the status lists under a
    framework, and what the selftest's child for it notes)."""
    return tuple(var.name for var in TABLE if framework in var.frameworks
                 and set(var.frameworks) != set(EVERY_FRAMEWORK))


C_SPACES = " \t\n\v\f\r"
"""What C's `isspace` counts as space (the "C" locale)."""


def alloc_conf_entries(value: str) -> list[tuple[str, str]]:
    """(key, entry as written) for each entry of a `PYTORCH_CUDA_ALLOC_CONF` value, split as PyTorch
    splits it: its `ConfigTokenizer` (c10/core/AllocatorConfig.h, torch 2.13; `lexArgs` before it) drops
    every space character, anywhere (`std::isspace`; older ones only ' '), and cuts at `,` `:` `[` `]`;
    `parseArgs` reads a key, then `:` and its value, then `,`. So a comma inside `[...]`
    (`roundup_power2_divisions:[256:1,512:2]`) ends no entry, and ` backend : native` is the key
    `backend`. Entries that are only spaces are left out (PyTorch refuses an empty one)."""
    entries, start, depth = [], 0, 0
    for at, char in enumerate(value + ","):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            entry = value[start:at]
            if entry.strip(C_SPACES):
                key = entry.partition(":")[0].partition("[")[0]
                entries.append((key.translate(dict.fromkeys(map(ord, C_SPACES))), entry))
            start = at + 1
    return entries

"""What the doctor finds and what it looks at: a `Check` (a verdict, a detail, a fix) and the `Machine`,
the facts gathered once (`tfgpu_magic.doctor.inspect_machine`) that every check reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..gpus.inventory import Inventory
from ..language.policy import Policy
from ..tf.apply import ConfigAPI

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"
CUDA_EXTRA = "and-cuda"
"""The extra of TensorFlow ≥ 2.14 that brings CUDA, cuDNN, cuBLAS ... as pip `nvidia-*` packages."""
LD_LIBRARY_PATH = "LD_LIBRARY_PATH"
JAX_CUDA_PLUGIN = re.compile(r"jax-cuda(\d+)-(plugin|pjrt)")
"""JAX's CUDA support since 0.4.31 (`pip install "jax[cuda12]"`): a plugin and its PJRT runtime,
each of jaxlib's exact version (else JAX says "JAX plugin jax_cuda12_plugin version X is not
compatible with jaxlib version Y" and runs on the CPU)."""


@dataclass(frozen=True)
class Check:
    """One check's finding: `verdict` is OK, WARN, FAIL or INFO; `fix` what to do ("" for none)."""

    name: str
    verdict: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Machine:
    """What the doctor looks at; tests build one by hand."""

    environ: Mapping[str, str]
    inventory: Inventory
    policy: Policy
    api: ConfigAPI
    tf_dir: Path | None
    tf_distribution: str | None
    device_nodes: tuple[str, ...]
    python: str
    path_python: str | None
    path_python_has_tf: bool | None
    nvml_binding: bool = True
    """nvidia-ml-py is installed (found, not imported: without a driver importing it is wasted)."""
    cuda_packages: Mapping[str, str | None] = field(default_factory=dict)
    """Each `nvidia-*` package TensorFlow's `and-cuda` extra requires → its installed version (None:
    missing); empty where TensorFlow declares no such extra (before 2.14)."""
    cuda_lib_dirs: tuple[str, ...] = ()
    """The `site-packages/nvidia/*/lib` folders those packages installed."""
    loader_path: str | None = None
    """LD_LIBRARY_PATH as this process started with it (the loader reads it only then); None: unknown."""
    loaded_libraries: tuple[str, ...] = ()
    """CUDA libraries already loaded in this process (`loaded_cuda_libraries`)."""
    compute_capabilities: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    """GPU index (nvidia-smi order) → its CUDA compute capability, as NVML reports it."""
    platform: str = "linux"
    """`sys.platform`."""
    kernel_version: str = ""
    """/proc/version ("microsoft" in it: WSL)."""
    torch_build: Mapping[str, object] | None = None
    """PyTorch's `torch.version` facts (`__version__`, `cuda`, `hip`) where it is installed
    (`read_torch_build`); None: not installed."""
    jax_packages: Mapping[str, str] = field(default_factory=dict)
    """`jax`, `jaxlib` and JAX's CUDA plugins installed here → version (`jax_distributions`); empty:
    JAX is not installed."""

"""`%tfgpu doctor`: why TensorFlow does (not) see a GPU, as ordered checks with a verdict and a fix,
and whether the other frameworks installed here (PyTorch, JAX) are CUDA builds. The checks are data
(`Check`); `views.doctor` words them.

Nothing here initializes TensorFlow or starts CUDA, nor imports PyTorch or JAX: TensorFlow's build is
read from its `build_info.py` and PyTorch's from its `version.py`, both parsed, never executed (or from
torch itself where the kernel imported it); pip CUDA packages and JAX's CUDA plugins from their
metadata, what the loader has loaded from `/proc/self/maps`, and TF's device list is only compared
once TF listed it.

Here the facts are gathered (`inspect_machine`) and the checks run in their order (`CHECKS`); the
records are in `records`, TensorFlow's build as read in `tfbuild`, and the checks themselves in
`driver_checks` (the way from the GPU to TensorFlow) and `environment_checks` (what is installed and set).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Mapping

from ..gpus.inventory import Inventory, Nvml, shared_nvml
from ..gpus.processes import MAPS_BYTES, read_capped
from ..language.policy import Policy
from ..tf.apply import ConfigAPI
from .driver_checks import (check_compute_capability, check_cuda_packages, check_device_nodes, check_gpu_order,
                            check_nvml, check_platform, check_tf_vs_nvml)
from .environment_checks import (check_allocator, check_cuda_visible, check_device_order, check_forced_growth,
                                 check_jax_build, check_python, check_tensorflow, check_torch_build, same_environment)
from .records import (CUDA_EXTRA, FAIL, INFO, JAX_CUDA_PLUGIN, LD_LIBRARY_PATH, OK, WARN,  # noqa: F401
                      Check, Machine)
from .tfbuild import covers, parse_architectures, read_build_info, tf_version  # noqa: F401 (callers use doctor.X)

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")
CUDA_LIBRARIES = ("libcudart", "libcudnn", "libcublas", "libcufft", "libcurand", "libcusolver", "libcusparse",
                  "libnccl", "libnvJitLink", "libcupti")
"""File-name prefixes of the CUDA libraries TensorFlow loads (not the driver's libcuda / libnvidia-*)."""
TORCH_BUILD = ("__version__", "cuda", "hip")
"""What `torch.version` (torch/version.py) says of a build: its version, CUDA's and ROCm's (None: not one)."""


def inspect_machine(environ: Mapping[str, str], inventory: Inventory, policy: Policy, api: ConfigAPI,
                    nvml: Nvml | None = None) -> Machine:
    """Gather the facts without touching TensorFlow's runtime; `nvml` (default: the process's
    session) is asked for the compute capabilities of the inventory's GPUs."""
    spec = importlib.util.find_spec("tensorflow") if "tensorflow" not in sys.modules else sys.modules["tensorflow"].__spec__
    tf_dir = Path(spec.origin).parent if spec is not None and spec.origin else None
    path_python = shutil.which("python3") or shutil.which("python")
    distribution = _tf_distribution()
    return Machine(
        environ=environ,
        inventory=inventory,
        policy=policy,
        api=api,
        tf_dir=tf_dir,
        tf_distribution=distribution,
        device_nodes=tuple(sorted(str(p) for p in [*Path("/dev").glob("nvidia*"), *Path("/dev").glob("dxg")])),
        python=sys.executable,
        path_python=path_python,
        path_python_has_tf=_has_tensorflow(path_python) if path_python else None,
        nvml_binding=importlib.util.find_spec("pynvml") is not None,
        cuda_packages=cuda_packages(distribution.split()[0]) if distribution else {},
        cuda_lib_dirs=_cuda_lib_dirs(),
        loader_path=_startup_variable(LD_LIBRARY_PATH),
        loaded_libraries=loaded_cuda_libraries(_read_text("/proc/self/maps")),
        compute_capabilities=read_compute_capabilities(inventory, nvml),
        platform=sys.platform,
        kernel_version=_read_text("/proc/version"),
        torch_build=read_torch_build(),
        jax_packages=jax_distributions(),
    )


def _tf_distribution() -> str | None:
    for name in TF_DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cuda_packages(distribution: str) -> dict[str, str | None]:
    """The `nvidia-*` packages `distribution`'s `and-cuda` extra requires, each with its installed
    version (None: missing), from the packages' metadata."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    found: dict[str, str | None] = {}
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if re.search(rf"extra\s*==\s*['\"]{CUDA_EXTRA}['\"]", marker):
            package = re.match(r"[A-Za-z0-9._-]+", name.strip())
            if package and package[0].startswith("nvidia-"):
                found[package[0]] = _version(package[0])
    return found


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_lib_dirs() -> tuple[str, ...]:
    """`nvidia/*/lib` in every folder of the `nvidia` namespace package (found, not imported)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return ()
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    return tuple(sorted(str(lib) for root in roots for lib in Path(root).glob("*/lib") if lib.is_dir()))


def _startup_variable(name: str) -> str | None:
    """`name` as this process started with it (/proc/self/environ), whatever os.environ says now;
    None where that cannot be read, '' where it was unset."""
    raw = read_capped(Path("/proc/self/environ"), MAPS_BYTES)
    if raw is None:
        return None
    prefix = name.encode() + b"="
    return next((item[len(prefix):].decode(errors="replace") for item in raw.split(b"\0") if item.startswith(prefix)),
                "")


def loaded_cuda_libraries(maps: str) -> tuple[str, ...]:
    """The CUDA libraries (pip's or the system's) mapped into a process, from its /proc/PID/maps
    text: TensorFlow found them once they are there."""
    paths = {fields[5] for fields in (line.split(maxsplit=5) for line in maps.splitlines()) if len(fields) == 6}
    return tuple(sorted(path for path in paths
                        if path.startswith("/") and Path(path).name.startswith(CUDA_LIBRARIES) and ".so" in path))


def _read_text(path: str) -> str:
    return (read_capped(Path(path), MAPS_BYTES) or b"").decode("utf-8", errors="replace")


def read_compute_capabilities(inventory: Inventory, nvml: Nvml | None = None) -> dict[int, tuple[int, int]]:
    """Each GPU's compute capability through the inventory's NVML chokepoint (None-safe), within its
    deadline ({} past it)."""
    if not inventory.available or not inventory.gpus:
        return {}
    session = nvml or shared_nvml()

    def read() -> dict[int, tuple[int, int]]:
        found = {}
        for gpu in inventory.gpus:
            handle = session.call("nvmlDeviceGetHandleByIndex", gpu.index)
            pair = session.call("nvmlDeviceGetCudaComputeCapability", handle) if handle is not None else None
            if isinstance(pair, (tuple, list)) and len(pair) == 2:
                found[gpu.index] = (int(pair[0]), int(pair[1]))
        return found

    answer = session.run(read, "compute capabilities")  # bounded like every NVML read: unknown past it
    return answer.value if answer.done else {}


def read_torch_build() -> dict[str, object] | None:
    """PyTorch's build (`TORCH_BUILD`): what the imported torch says, else its `torch/version.py`
    parsed (a CUDA wheel from PyPI has no `+cuXXX` in its distribution's version, only there); None
    where torch is not installed, {} where its version.py cannot be read."""
    version = getattr(sys.modules.get("torch"), "version", None)
    if version is not None:
        return {name: getattr(version, name, None) for name in TORCH_BUILD}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        found = read_version_file(Path(list(spec.submodule_search_locations)[0]) / "version.py")
    except (OSError, SyntaxError, ValueError):
        return {}
    return {name: found.get(name) for name in TORCH_BUILD} if "__version__" in found else {}


def read_version_file(path: Path) -> dict[str, object]:
    """The literal module-level assignments of a `version.py` (`cuda: Optional[str] = '12.8'`), parsed."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def jax_distributions() -> dict[str, str]:
    """`jax`, `jaxlib` and every `jax-cudaNN-plugin` / `jax-cudaNN-pjrt` installed → version; {}
    without `jax` (from the distributions' metadata: nothing is imported)."""
    if _version("jax") is None:
        return {}
    found = {}
    for distribution in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", distribution.metadata.get("Name") or "").lower()
        if name in ("jax", "jaxlib") or JAX_CUDA_PLUGIN.fullmatch(name):
            found.setdefault(name, distribution.version)  # the first on sys.path, as Python imports it
    return found


def _has_tensorflow(python: str) -> bool | None:
    """Whether `python` can find tensorflow (without importing it)."""
    if same_environment(python, sys.executable):
        return importlib.util.find_spec("tensorflow") is not None
    import subprocess

    try:
        done = subprocess.run(
            [python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode == 0


def run_checks(machine: Machine) -> list[Check]:
    """Every check that has something to say, in `CHECKS`' order (what the others depend on first)."""
    checks: list[Check] = []
    for check in CHECKS:
        result = check(machine)
        if result is not None:
            checks.append(result)
    return checks


CHECKS: tuple[Callable[[Machine], Check | None], ...] = (
    check_platform,
    check_nvml,
    check_device_nodes,
    check_cuda_packages,
    check_tensorflow,
    check_python,
    check_compute_capability,
    check_torch_build,
    check_jax_build,
    check_cuda_visible,
    check_device_order,
    check_forced_growth,
    check_allocator,
    check_tf_vs_nvml,
    check_gpu_order,
)
"""The checks in the order the layers depend on each other, so that "fix the first one first" holds:
the platform (an NVIDIA GPU can reach it at all), the driver (NVML), the device nodes that pass the GPU
into this machine or container, the CUDA libraries, TensorFlow's build (installed for the kernel's
Python, built for these cards), the other frameworks' builds (PyTorch, JAX: a warning, never why
TensorFlow has no GPU), then what steers CUDA once all that is there (CUDA_* variables, the
allocator's), and last what TensorFlow itself lists. A CPU-only TensorFlow on a machine without a GPU
is not the first thing to fix."""

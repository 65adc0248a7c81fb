"""`%tfgpu doctor`: why TensorFlow does (not) see a GPU, as ordered checks with a verdict and a fix,
and whether the other frameworks installed here (PyTorch, JAX) are CUDA builds. The checks are data
(`Check`); `views.doctor` words them.

Nothing here initializes TensorFlow or starts CUDA, nor imports PyTorch or JAX: TensorFlow's build is
read from its `build_info.py` and PyTorch's from its `version.py`, both parsed, never executed (or from
torch itself where the kernel imported it); pip CUDA packages and JAX's CUDA plugins from their
metadata, what the loader has loaded from `/proc/self/maps`, and TF's device list is only compared
once TF listed it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .gpus.cudaenv import parse_cuda_visible
from .gpus.inventory import NO_BINDING, NOT_ANSWERING, Gpu, Inventory, Nvml, shared_nvml
from .gpus.processes import MAPS_BYTES, read_capped
from .language.policy import Policy
from .envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from .tf.apply import ConfigAPI
from .tf.runtime import ASYNC_ALLOCATOR

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")
CUDA_EXTRA = "and-cuda"
"""The extra of TensorFlow ≥ 2.14 that brings CUDA, cuDNN, cuBLAS ... as pip `nvidia-*` packages."""
LD_LIBRARY_PATH = "LD_LIBRARY_PATH"
CUDA_LIBRARIES = ("libcudart", "libcudnn", "libcublas", "libcufft", "libcurand", "libcusolver", "libcusparse",
                  "libnccl", "libnvJitLink", "libcupti")
"""File-name prefixes of the CUDA libraries TensorFlow loads (not the driver's libcuda / libnvidia-*)."""
FINDS_PIP_CUDA_ITSELF = (2, 16)
"""Below this TensorFlow finds its pip CUDA libraries by itself; from 2.16 the loader may not
(tensorflow#63362, #65842) unless their folders are on LD_LIBRARY_PATH."""
LAST_WINDOWS_GPU = (2, 10)
"""The last TensorFlow with GPU support on native Windows."""
JAX_CUDA_PLUGIN = re.compile(r"jax-cuda(\d+)-(plugin|pjrt)")
"""JAX's CUDA support since 0.4.31 (`pip install "jax[cuda12]"`): a plugin and its PJRT runtime,
each of jaxlib's exact version (else JAX says "JAX plugin jax_cuda12_plugin version X is not
compatible with jaxlib version Y" and runs on the CPU)."""
TORCH_BUILD = ("__version__", "cuda", "hip")
"""What `torch.version` (torch/version.py) says of a build: its version, CUDA's and ROCm's (None: not one)."""
TORCH_CUDA_FIX = ("pip uninstall -y torch && pip install torch (PyPI's Linux wheels are CUDA builds; another "
                  "CUDA version: https://pytorch.org/get-started/locally/), then restart the kernel")
JAX_CUDA_FIX = 'pip install -U "jax[cuda12]" (or "jax[cuda13]" with an NVIDIA driver 580 or newer), then restart the kernel'


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


def same_environment(python: str, other: str) -> bool:
    """Two interpreters of one environment live in one bin folder. Symlinks are not resolved: a
    venv's python links to its base interpreter, yet has other packages."""
    return Path(os.path.abspath(python)).parent == Path(os.path.abspath(other)).parent


def read_build_info(tf_dir: Path) -> dict[str, object]:
    """TensorFlow's build facts from `python/platform/build_info.py`, parsed, never executed."""
    source = (tf_dir / "python" / "platform" / "build_info.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "build_info" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            return dict(ast.literal_eval(value))
    return {}


def run_checks(machine: Machine) -> list[Check]:
    """Every check that has something to say, in `CHECKS`' order (what the others depend on first)."""
    checks: list[Check] = []
    for check in CHECKS:
        result = check(machine)
        if result is not None:
            checks.append(result)
    return checks


def _check_tensorflow(m: Machine) -> Check:
    if m.tf_dir is None:
        return Check("TensorFlow", FAIL, f"not installed for this kernel's Python ({m.python})",
                     f"{m.python} -m pip install tensorflow")
    try:
        info = read_build_info(m.tf_dir)
    except (OSError, SyntaxError, ValueError) as err:
        return Check("TensorFlow", WARN, f"{m.tf_distribution or 'installed'}; build info unreadable: {err}")
    if not info.get("is_cuda_build"):
        return Check("TensorFlow build", FAIL, f"{m.tf_distribution or 'TensorFlow'} is a CPU-only build: it never uses a GPU",
                     "pip uninstall tensorflow-cpu && pip install 'tensorflow[and-cuda]' (Linux)")
    return Check("TensorFlow build", OK,
                 f"{m.tf_distribution or 'TensorFlow'}, built with CUDA {info.get('cuda_version', '?')}, cuDNN {info.get('cudnn_version', '?')}")


def _build_info(m: Machine) -> dict[str, object] | None:
    """The build facts, None where TensorFlow is missing or its build info unreadable (the
    TensorFlow check says so)."""
    if m.tf_dir is None:
        return None
    try:
        return read_build_info(m.tf_dir)
    except (OSError, SyntaxError, ValueError):
        return None


def tf_version(m: Machine) -> tuple[int, int] | None:
    """(major, minor) of the installed TensorFlow distribution ("tensorflow 2.21.0" → (2, 21))."""
    found = re.search(r" (\d+)\.(\d+)", m.tf_distribution or "")
    return (int(found[1]), int(found[2])) if found else None


def _check_platform(m: Machine) -> Check | None:
    """Native Windows lost TensorFlow's GPU support after 2.10; WSL1 has no GPU; WSL2 has one through
    /dev/dxg and the Windows driver. Plain Linux says nothing."""
    version = tf_version(m)
    if m.platform == "win32":
        if version is not None and version <= LAST_WINDOWS_GPU:
            return Check("platform", INFO, f"native Windows with TensorFlow {version[0]}.{version[1]}: its GPU build "
                         "needs CUDA 11.2 and cuDNN 8.1 installed system-wide")
        return Check("platform", FAIL, "native Windows: TensorFlow's GPU support ended with 2.10; newer releases "
                     "run on the CPU only",
                     "run Jupyter inside WSL2 (Ubuntu) and `pip install 'tensorflow[and-cuda]'` there, or on native "
                     "Windows `pip install 'tensorflow<2.11'` with CUDA 11.2 and cuDNN 8.1 (Python ≤ 3.10)")
    if m.platform == "darwin":
        return Check("platform", FAIL, "macOS has no CUDA: TensorFlow never uses an NVIDIA GPU here",
                     "for the Apple GPU: `pip install tensorflow-metal`")
    kernel = m.kernel_version.lower()
    if "microsoft" not in kernel:
        return None
    if "wsl2" not in kernel and "microsoft-standard" not in kernel:
        return Check("platform", FAIL, "WSL1: it passes no GPU to Linux", "in Windows: `wsl --set-version <distro> 2`")
    if "/dev/dxg" not in m.device_nodes:
        return Check("platform", FAIL, "WSL2 without /dev/dxg: Windows passes no GPU to this distribution",
                     "install the current NVIDIA driver in Windows (it includes WSL support), `wsl --update`, "
                     "then `wsl --shutdown`; do not install a Linux NVIDIA driver inside WSL")
    return Check("platform", OK, "WSL2 with a GPU passed through (/dev/dxg); the driver is the Windows one")


def _check_cuda_packages(m: Machine) -> Check | None:
    """TensorFlow ≥ 2.14's `tensorflow[and-cuda]`: every pip `nvidia-*` package present, and the
    loader able to find them (from 2.16 their folders must be on LD_LIBRARY_PATH at start)."""
    name = "CUDA libraries (pip)"
    info = _build_info(m)
    if info is None:
        return None
    if not info.get("is_cuda_build"):
        return Check(name, INFO, "not needed: a CPU-only TensorFlow loads no CUDA library")
    if not m.cuda_packages:
        return None
    distribution = (m.tf_distribution or "tensorflow").split()
    pin = f"=={distribution[1]}" if len(distribution) > 1 else ""
    install = f"pip install '{distribution[0]}[{CUDA_EXTRA}]{pin}'"
    missing = [package for package, version in m.cuda_packages.items() if version is None]
    loaded = sorted({Path(path).name for path in m.loaded_libraries})
    if missing:
        if loaded:
            return Check(name, OK, f"{', '.join(missing)} not from pip, but loaded: {', '.join(loaded)}")
        return Check(name, FAIL, f"{len(missing)} of the {len(m.cuda_packages)} packages of {distribution[0]}"
                     f"[{CUDA_EXTRA}] not installed: {', '.join(missing)} (needed unless CUDA "
                     f"{info.get('cuda_version', '?')} and cuDNN {info.get('cudnn_version', '?')} are installed "
                     "system-wide)", install)
    have = f"{len(m.cuda_packages)} packages of {distribution[0]}[{CUDA_EXTRA}] installed"
    if loaded:
        return Check(name, OK, f"{have}; loaded: {', '.join(loaded)}")
    version = tf_version(m)
    if version is not None and version < FINDS_PIP_CUDA_ITSELF:
        return Check(name, OK, f"{have}; TensorFlow {version[0]}.{version[1]} finds them by itself")
    at_start = m.loader_path if m.loader_path is not None else m.environ.get(LD_LIBRARY_PATH, "")
    on_path = {os.path.normpath(entry) for entry in at_start.split(os.pathsep) if entry}
    absent = [lib for lib in m.cuda_lib_dirs if os.path.normpath(lib) not in on_path]
    if not absent:
        return Check(name, OK, f"{have}, their lib folders on {LD_LIBRARY_PATH}" if m.cuda_lib_dirs else have)
    late = m.loader_path is not None and m.environ.get(LD_LIBRARY_PATH, "") != m.loader_path
    return Check(name, WARN, f"{have}, but {len(absent)} of their lib folders are not on {LD_LIBRARY_PATH}"
                 + (" as this process started (it was changed since; the loader reads it only at start)" if late else "")
                 + ": TensorFlow 2.16+ may then not find them and list no GPU (tensorflow#63362, #65842)",
                 f"before starting Jupyter (or in the kernelspec's env): export {LD_LIBRARY_PATH}="
                 f"{os.pathsep.join(absent)}${{{LD_LIBRARY_PATH}:+:${LD_LIBRARY_PATH}}}, then restart the kernel")


def parse_architectures(entries: object) -> list[tuple[str, int, int, str]]:
    """build_info's `cuda_compute_capabilities` ('sm_80', 'compute_90', 'sm_90a') as
    (kind, major, minor, suffix); kind 'sm' is a binary, 'compute' PTX."""
    parsed = []
    for entry in entries if isinstance(entries, (list, tuple)) else ():
        found = re.fullmatch(r"(sm|compute)_(\d+)(\d)([a-z]?)", str(entry).strip())
        if found:
            parsed.append((found[1], int(found[2]), int(found[3]), found[4]))
    return parsed


def _covers(architectures: list[tuple[str, int, int, str]], capability: tuple[int, int]) -> str | None:
    """How TensorFlow runs on a card of `capability`: 'sm_XY' (a binary of its major version at or
    below its minor; an 'a' binary only on its exact card), 'compute_XY' (PTX at or below it, compiled
    by the driver at start), or None (no kernel at all)."""
    major, minor = capability
    binaries = [(a, b, s) for kind, a, b, s in architectures if kind == "sm"
                and a == major and (b == minor if s else b <= minor)]
    if binaries:
        a, b, s = max(binaries)
        return f"sm_{a}{b}{s}"
    ptx = [(a, b) for kind, a, b, _ in architectures if kind == "compute" and (a, b) <= capability]
    if ptx:
        a, b = max(ptx)
        return f"compute_{a}{b}"
    return None


def _check_compute_capability(m: Machine) -> Check | None:
    """Each GPU's compute capability against the architectures TensorFlow was built for: new cards
    an installed TensorFlow has no kernels for (tensorflow#89272, #97387)."""
    info = _build_info(m)
    architectures = parse_architectures(info.get("cuda_compute_capabilities")) if info else []
    if not architectures or not m.compute_capabilities:
        return None
    built = ", ".join(f"{kind}_{a}{b}{s}" for kind, a, b, s in architectures)
    names = {gpu.index: gpu.name for gpu in m.inventory.gpus}
    cards, fails, jit = [], [], []
    for index, capability in sorted(m.compute_capabilities.items()):
        how = _covers(architectures, capability)
        cards.append(f"GPU {index} ({names.get(index) or '?'}, {capability[0]}.{capability[1]}): {how or 'none'}")
        (fails if how is None else jit if how.startswith("compute") else []).append(index)
    detail = f"TensorFlow has kernels for {built}; " + ", ".join(cards)
    newest = max(m.compute_capabilities.values())
    wanted = f"compute capability {newest[0]}.{newest[1]}"
    newer = f"`pip install -U 'tensorflow[{CUDA_EXTRA}]'` if a release is built for {wanted}, else " \
            f"`pip install 'tf-nightly[{CUDA_EXTRA}]'` or NVIDIA's NGC TensorFlow container"
    if fails:
        oldest = min(m.compute_capabilities.values())
        lowest = min((a, b) for _, a, b, _ in architectures)
        if oldest < lowest:
            return Check("GPU architecture", FAIL, detail + f": this TensorFlow needs {lowest[0]}.{lowest[1]} or newer",
                         "an older TensorFlow built for that card, or TensorFlow built from source for it")
        return Check("GPU architecture", FAIL, detail + ": TensorFlow cannot run a kernel there", newer)
    if jit:
        return Check("GPU architecture", WARN, detail + ": the driver compiles TensorFlow's PTX at the first "
                     "start (minutes), and it can fail (CUDA_ERROR_INVALID_PTX)",
                     f"set CUDA_CACHE_MAXSIZE=4294967296 to keep the compiled kernels; for native ones {newer}")
    return Check("GPU architecture", OK, detail)


WEDGED_FIX = ("run `nvidia-smi` in a terminal: if it hangs too, the driver is wedged, and `sudo dmesg | grep -i xid` "
              "shows the GPU error that did it; only a GPU reset (`sudo nvidia-smi -r -i N`, with no process on that "
              "card) or a reboot clears it: ask the machine's admin")
"""A driver stuck in the kernel answers nothing until the GPU is reset or the machine rebooted
(https://github.com/leptonai/gpud/pull/117: nvidia-smi in state D after Xid 45)."""


def _check_nvml(m: Machine) -> Check:
    if m.inventory.blocked_seconds is not None:
        shown = f"; the GPU figures shown are {m.inventory.stale_seconds:.0f} s old" if m.inventory.stale else ""
        return Check("NVIDIA driver / NVML", FAIL, f"{NOT_ANSWERING}: an NVML call has waited "
                     f"{m.inventory.blocked_seconds:.0f} s{shown}", WEDGED_FIX)
    if not m.inventory.available:
        missing_binding = m.inventory.error == NO_BINDING
        fix = "pip install nvidia-ml-py" if missing_binding else (
            "install the NVIDIA driver on the host (nvidia-smi must work), or start the container with GPUs "
            "(--gpus all)" + ("" if m.nvml_binding else "; for this tool's inventory: pip install nvidia-ml-py"))
        return Check("NVIDIA driver / NVML", WARN if missing_binding else FAIL, m.inventory.error or "unavailable", fix)
    names = ", ".join(f"{g.index}: {g.name}" for g in m.inventory.gpus) or "none"
    verdict = OK if m.inventory.gpus else FAIL
    return Check("NVIDIA driver / NVML", verdict, f"driver {m.inventory.driver_version}, GPUs {names}",
                 "" if m.inventory.gpus else "NVML works but lists no GPU: check the host and the container's --gpus")


def _check_device_nodes(m: Machine) -> Check | None:
    if m.platform != "linux":
        return None  # /dev/nvidiaN is Linux's; the platform check speaks for Windows and macOS
    if any(node.rstrip("0123456789").endswith("/dev/nvidia") and node[-1].isdigit() for node in m.device_nodes):
        return Check("device nodes", OK, ", ".join(m.device_nodes))
    if "/dev/dxg" in m.device_nodes:
        return Check("device nodes", OK, "/dev/dxg: a GPU passed through by WSL2")
    return Check("device nodes", FAIL, "no /dev/nvidia0, /dev/nvidia1, ... in this machine or container",
                 "no GPU is attached here; in Docker start with --gpus all (NVIDIA Container Toolkit), in Kubernetes "
                 "request nvidia.com/gpu")


def _check_cuda_visible(m: Machine) -> Check:
    raw = m.environ.get(CUDA_VISIBLE_DEVICES)
    parsed = parse_cuda_visible(raw, m.inventory.known_refs())
    if not parsed.restricts:
        return Check(CUDA_VISIBLE_DEVICES, OK, "not set: every GPU is visible")
    if parsed.hides_all:
        why = f"stops at its first entry {parsed.stopped_at!r}" if parsed.stopped_at else "is empty"
        return Check(CUDA_VISIBLE_DEVICES, FAIL, f"{raw!r} {why}: it hides every GPU",
                     "`%tfgpu visible all` (or `visible 0`) before importing TensorFlow, or unset it")
    detail = f"{raw!r} → GPUs {', '.join(parsed.entries)}"
    if parsed.stopped_at:
        return Check(CUDA_VISIBLE_DEVICES, WARN, f"{detail}; CUDA stops at {parsed.stopped_at!r} and ignores the rest",
                     "remove the invalid entry")
    return Check(CUDA_VISIBLE_DEVICES, OK, detail)


def _check_device_order(m: Machine) -> Check:
    order = m.environ.get(CUDA_DEVICE_ORDER)
    if order == "PCI_BUS_ID":
        return Check(CUDA_DEVICE_ORDER, OK, "PCI_BUS_ID: TensorFlow's GPU numbers match nvidia-smi's")
    return Check(CUDA_DEVICE_ORDER, INFO, f"{order or 'unset'} (CUDA's default: fastest first), so 'GPU 1' in TensorFlow "
                 "may be another card than nvidia-smi's GPU 1", "any `%tfgpu` GPU directive sets PCI_BUS_ID")


def _check_python(m: Machine) -> Check | None:
    if m.path_python is None:
        return Check("Python", INFO, f"the kernel runs {m.python}; there is no `python3` on PATH")
    if same_environment(m.path_python, m.python):
        return Check("Python", OK, f"the kernel runs {m.python}, the same as `python3` on PATH")
    extra = ""
    if m.path_python_has_tf and m.tf_dir is None:
        extra = "; TensorFlow is installed for that one, not for the kernel's"
    return Check("Python", INFO if not extra else FAIL,
                 f"the kernel runs {m.python}, `python3` on PATH is {m.path_python}{extra}",
                 "install TensorFlow with `%pip install tensorflow` from the notebook (it uses the kernel's Python)"
                 if extra else "")


def _check_forced_growth(m: Machine) -> Check | None:
    forced = m.environ.get(TF_FORCE_GPU_ALLOW_GROWTH)
    if forced is None:
        return None
    wanted = m.policy.growth
    if forced in ("true", "false") and wanted is not None and (forced == "true") != wanted:
        return Check(TF_FORCE_GPU_ALLOW_GROWTH, WARN, f"={forced} overrides the policy's growth {'on' if wanted else 'off'}",
                     "unset it, or `%tfgpu growth " + ("on" if forced == "true" else "off") + "`")
    if forced not in ("true", "false"):
        return Check(TF_FORCE_GPU_ALLOW_GROWTH, WARN, f"={forced!r}: TensorFlow only reads 'true' or 'false'")
    return Check(TF_FORCE_GPU_ALLOW_GROWTH, INFO, f"={forced}: every GPU allocator uses it")


def _check_allocator(m: Machine) -> Check | None:
    if m.environ.get(TF_GPU_ALLOCATOR) != ASYNC_ALLOCATOR:
        return None
    if m.policy.limits or m.policy.splits:
        return Check(TF_GPU_ALLOCATOR, WARN, "cuda_malloc_async makes the memory limits soft, not hard caps",
                     "`%tfgpu allocator bfc` for hard caps")
    return Check(TF_GPU_ALLOCATOR, INFO, "cuda_malloc_async: memory is allocated on demand")


def _check_tf_vs_nvml(m: Machine) -> Check:
    if not m.api.state().devices_listed:
        return Check("TensorFlow's GPUs", INFO, "not listed yet (listing starts CUDA, after which CUDA_* settings are "
                     "too late)", "run `tf.config.list_physical_devices('GPU')` after your policy, then doctor again")
    seen = len(m.api.devices("GPU"))
    nvml = len(m.inventory.gpus) if m.inventory.available else None
    if seen == 0:
        return Check("TensorFlow's GPUs", FAIL, "TensorFlow lists no GPU", "see the failed checks above")
    if nvml is not None and seen != nvml:
        return Check("TensorFlow's GPUs", INFO, f"TensorFlow lists {seen}, NVML sees {nvml} (CUDA_VISIBLE_DEVICES "
                     "or the policy hides the others)")
    return Check("TensorFlow's GPUs", OK, f"TensorFlow lists {seen} GPU(s)")


def _check_gpu_order(m: Machine) -> Check | None:
    """TensorFlow's GPU names against the cards nvidia-smi numbers the same, once TF listed them
    (`get_device_details` does not initialize). CUDA numbers fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID was set before it started; TF gives no PCI bus id before it creates
    devices, so cards of one model cannot be told apart by name."""
    if not m.api.state().devices_listed or not m.inventory.available or not m.inventory.gpus:
        return None
    raw = m.environ.get(CUDA_VISIBLE_DEVICES)
    known = m.inventory.known_refs() or set()
    refs = parse_cuda_visible(raw, known).entries if raw is not None else [gpu.ref for gpu in m.inventory.gpus]
    cards = []
    for ref in refs:
        found = m.inventory.find(ref) if ref in known else None
        cards.append(found if isinstance(found, Gpu) else None)
    pairs = []
    for index, device in enumerate(m.api.devices("GPU")):
        card = cards[index] if index < len(cards) else None
        try:
            name = m.api.details(device).get("device_name")
        except (ValueError, *m.api.errors()):  # the doctor reports, it never fails on TF's account
            return None
        if card is None or card.name is None or name is None:
            return None  # a MIG instance or an unknown name: nothing to compare
        pairs.append((index, name, card))
    if len({card.name for _, _, card in pairs}) < 2:
        return None
    wrong = [(index, name, card) for index, name, card in pairs if name != card.name]
    if not wrong:
        return Check("GPU order", OK, "TensorFlow's GPUs are the cards nvidia-smi numbers the same")
    index, name, card = wrong[0]
    return Check("GPU order", WARN, f"TensorFlow's GPU:{index} is a {name}, but the card in that place in nvidia-smi's "
                 f"order is GPU {card.index} ({card.name}, bus {card.pci_bus_id or '?'}): CUDA numbered the GPUs "
                 "fastest first (it started before CUDA_DEVICE_ORDER=PCI_BUS_ID)",
                 "restart the kernel with a GPU policy (it sets CUDA_DEVICE_ORDER=PCI_BUS_ID before CUDA starts)")


def _check_torch_build(m: Machine) -> Check | None:
    """PyTorch installed here: a CUDA build, or one that never uses an NVIDIA GPU."""
    build = m.torch_build
    if build is None:
        return None
    version = build.get("__version__") or "?"
    if not build:
        return Check("PyTorch build", WARN, "installed; its torch/version.py is unreadable")
    if build.get("cuda"):
        return Check("PyTorch build", OK, f"torch {version}, built with CUDA {build['cuda']}")
    kind = f"a ROCm build (HIP {build['hip']})" if build.get("hip") else "a CPU-only build"
    return Check("PyTorch build", WARN, f"torch {version} is {kind}: PyTorch never uses an NVIDIA GPU", TORCH_CUDA_FIX)


def _check_jax_build(m: Machine) -> Check | None:
    """JAX installed here: its CUDA plugin and PJRT runtime, of jaxlib's exact version."""
    packages = m.jax_packages
    if not packages:
        return None
    jaxlib = packages.get("jaxlib")
    installed = f"jax {packages.get('jax', '?')}, jaxlib {jaxlib or 'missing'}"
    if jaxlib is not None and "+cuda" in jaxlib:
        return Check("JAX build", OK, f"{installed} (a CUDA build of jaxlib)")
    plugins = {name: version for name, version in packages.items() if JAX_CUDA_PLUGIN.fullmatch(name)}
    if not plugins:
        return Check("JAX build", WARN, f"{installed}, no CUDA plugin: JAX runs on the CPU only", JAX_CUDA_FIX)
    listed = ", ".join(f"{name} {version}" for name, version in sorted(plugins.items()))
    cudas = sorted({JAX_CUDA_PLUGIN.fullmatch(name)[1] for name in plugins})
    missing = [f"jax-cuda{cuda}-{part}" for cuda in cudas for part in ("plugin", "pjrt")
               if f"jax-cuda{cuda}-{part}" not in plugins]
    fix = f'pip install -U "jax[cuda{cudas[-1]}]", then restart the kernel'
    if missing:
        return Check("JAX build", WARN, f"{installed}, {listed}, but {', '.join(missing)} missing: JAX runs on the CPU "
                     "only", fix)
    stale = [name for name, version in sorted(plugins.items()) if jaxlib is not None and version != jaxlib]
    if stale:
        return Check("JAX build", WARN, f"{installed}, {listed}: {', '.join(stale)} not of jaxlib's version, so JAX "
                     "leaves its CUDA plugin out and runs on the CPU only", fix)
    return Check("JAX build", OK, f"{installed}, {listed}")


CHECKS: tuple[Callable[[Machine], Check | None], ...] = (
    _check_platform,
    _check_nvml,
    _check_device_nodes,
    _check_cuda_packages,
    _check_tensorflow,
    _check_python,
    _check_compute_capability,
    _check_torch_build,
    _check_jax_build,
    _check_cuda_visible,
    _check_device_order,
    _check_forced_growth,
    _check_allocator,
    _check_tf_vs_nvml,
    _check_gpu_order,
)
"""The checks in the order the layers depend on each other, so that "fix the first one first" holds:
the platform (an NVIDIA GPU can reach it at all), the driver (NVML), the device nodes that pass the GPU
into this machine or container, the CUDA libraries, TensorFlow's build (installed for the kernel's
Python, built for these cards), the other frameworks' builds (PyTorch, JAX: a warning, never why
TensorFlow has no GPU), then what steers CUDA once all that is there (CUDA_* variables, the
allocator's), and last what TensorFlow itself lists. A CPU-only TensorFlow on a machine without a GPU
is not the first thing to fix."""


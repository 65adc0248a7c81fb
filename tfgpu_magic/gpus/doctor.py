"""`%tfgpu doctor`: why TensorFlow does (not) see a GPU, as ordered checks with a verdict and a fix.

Nothing here initializes TensorFlow or starts CUDA: TensorFlow's build is read from its
`build_info.py` without importing it, and TF's device list is only compared once TF listed it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from .cudaenv import parse_cuda_visible
from .inventory import Gpu, Inventory
from ..language.policy import Policy
from ..tf.envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from ..tf.runtime import ASYNC_ALLOCATOR, ConfigAPI

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    detail: str
    fix: str = ""

    def render(self) -> str:
        line = f"[{self.verdict:>4}] {self.name}: {self.detail}"
        return line + (f"\n       fix: {self.fix}" if self.fix else "")


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


def inspect_machine(environ: Mapping[str, str], inventory: Inventory, policy: Policy, api: ConfigAPI) -> Machine:
    """Gather the facts without touching TensorFlow's runtime."""
    spec = importlib.util.find_spec("tensorflow") if "tensorflow" not in sys.modules else sys.modules["tensorflow"].__spec__
    tf_dir = Path(spec.origin).parent if spec is not None and spec.origin else None
    path_python = shutil.which("python3") or shutil.which("python")
    return Machine(
        environ=environ,
        inventory=inventory,
        policy=policy,
        api=api,
        tf_dir=tf_dir,
        tf_distribution=_tf_distribution(),
        device_nodes=tuple(sorted(str(p) for p in [*Path("/dev").glob("nvidia*"), *Path("/dev").glob("dxg")])),
        python=sys.executable,
        path_python=path_python,
        path_python_has_tf=_has_tensorflow(path_python) if path_python else None,
        nvml_binding=importlib.util.find_spec("pynvml") is not None,
    )


def _tf_distribution() -> str | None:
    for name in TF_DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


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
    """Every check, in the order a user should fix things."""
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


def _check_nvml(m: Machine) -> Check:
    if not m.inventory.available:
        missing_binding = (m.inventory.error or "").startswith("nvidia-ml-py is not installed")
        fix = "pip install nvidia-ml-py" if missing_binding else (
            "install the NVIDIA driver on the host (nvidia-smi must work), or start the container with GPUs "
            "(--gpus all)" + ("" if m.nvml_binding else "; for this tool's inventory: pip install nvidia-ml-py"))
        return Check("NVIDIA driver / NVML", WARN if missing_binding else FAIL, m.inventory.error or "unavailable", fix)
    names = ", ".join(f"{g.index}: {g.name}" for g in m.inventory.gpus) or "none"
    verdict = OK if m.inventory.gpus else FAIL
    return Check("NVIDIA driver / NVML", verdict, f"driver {m.inventory.driver_version}, GPUs {names}",
                 "" if m.inventory.gpus else "NVML works but lists no GPU: check the host and the container's --gpus")


def _check_device_nodes(m: Machine) -> Check:
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
    refs = parse_cuda_visible(raw, m.inventory.known_refs()).entries if raw is not None else \
        [gpu.ref for gpu in m.inventory.gpus]
    cards = []
    for ref in refs:
        found = m.inventory.find(ref) if ref in (m.inventory.known_refs() or ()) else None
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


CHECKS: tuple[Callable[[Machine], Check | None], ...] = (
    _check_tensorflow,
    _check_nvml,
    _check_device_nodes,
    _check_cuda_visible,
    _check_device_order,
    _check_python,
    _check_forced_growth,
    _check_allocator,
    _check_tf_vs_nvml,
    _check_gpu_order,
)


def summary(checks: list[Check]) -> str:
    """One closing sentence: why TensorFlow has no GPU here, or that all is well."""
    failed = [c for c in checks if c.verdict == FAIL]
    if not failed:
        return "Nothing stops TensorFlow from using the GPUs above."
    reasons = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return f"TensorFlow has no GPU here because: {reasons}. Fix the first one first."


def report_text(checks: list[Check]) -> str:
    """The checks, one block each, then the closing sentence: the doctor's plain-text form."""
    return "\n".join([c.render() for c in checks] + ["", summary(checks)])


def report(machine: Machine) -> str:
    """The doctor's text for `machine` (`actions.doctor` gives it as a result for notebooks too)."""
    return report_text(run_checks(machine))

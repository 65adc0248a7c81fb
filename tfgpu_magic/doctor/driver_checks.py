"""The doctor's checks of the way from an NVIDIA GPU to TensorFlow: the platform, the driver (NVML),
the device nodes, the CUDA libraries, the cards' architectures against TensorFlow's build, and what
TensorFlow lists against what NVML sees (how many, in which order)."""

from __future__ import annotations

import os
from pathlib import Path

from ..envvars import CUDA_VISIBLE_DEVICES
from ..gpus.cudaenv import parse_cuda_visible
from ..gpus.inventory import NO_BINDING, NOT_ANSWERING, Gpu
from .records import CUDA_EXTRA, FAIL, INFO, LD_LIBRARY_PATH, OK, WARN, Check, Machine
from .tfbuild import build_info, covers, parse_architectures, tf_version

FINDS_PIP_CUDA_ITSELF = (2, 16)
"""Below this TensorFlow finds its pip CUDA libraries by itself; from 2.16 the loader may not
(tensorflow#63362, #65842) unless their folders are on LD_LIBRARY_PATH."""
LAST_WINDOWS_GPU = (2, 10)
"""The last TensorFlow with GPU support on native Windows."""


def check_platform(m: Machine) -> Check | None:
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


def check_cuda_packages(m: Machine) -> Check | None:
    """TensorFlow ≥ 2.14's `tensorflow[and-cuda]`: every pip `nvidia-*` package present, and the
    loader able to find them (from 2.16 their folders must be on LD_LIBRARY_PATH at start)."""
    name = "CUDA libraries (pip)"
    info = build_info(m)
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


def check_compute_capability(m: Machine) -> Check | None:
    """Each GPU's compute capability against the architectures TensorFlow was built for: new cards
    an installed TensorFlow has no kernels for (tensorflow#89272, #97387)."""
    info = build_info(m)
    architectures = parse_architectures(info.get("cuda_compute_capabilities")) if info else []
    if not architectures or not m.compute_capabilities:
        return None
    built = ", ".join(f"{kind}_{a}{b}{s}" for kind, a, b, s in architectures)
    names = {gpu.index: gpu.name for gpu in m.inventory.gpus}
    cards, fails, jit = [], [], []
    for index, capability in sorted(m.compute_capabilities.items()):
        how = covers(architectures, capability)
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


def check_nvml(m: Machine) -> Check:
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


def check_device_nodes(m: Machine) -> Check | None:
    if m.platform != "linux":
        return None  # /dev/nvidiaN is Linux's; the platform check speaks for Windows and macOS
    if any(node.rstrip("0123456789").endswith("/dev/nvidia") and node[-1].isdigit() for node in m.device_nodes):
        return Check("device nodes", OK, ", ".join(m.device_nodes))
    if "/dev/dxg" in m.device_nodes:
        return Check("device nodes", OK, "/dev/dxg: a GPU passed through by WSL2")
    return Check("device nodes", FAIL, "no /dev/nvidia0, /dev/nvidia1, ... in this machine or container",
                 "no GPU is attached here; in Docker start with --gpus all (NVIDIA Container Toolkit), in Kubernetes "
                 "request nvidia.com/gpu")


def check_tf_vs_nvml(m: Machine) -> Check:
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


def check_gpu_order(m: Machine) -> Check | None:
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

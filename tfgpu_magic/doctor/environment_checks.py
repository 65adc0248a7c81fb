"""The doctor's checks of what is installed for the kernel and what is set: TensorFlow's build for the
kernel's Python, PyTorch's and JAX's builds (a CPU build of either is a warning, never why TensorFlow has
no GPU), and the variables that steer CUDA and TensorFlow's allocator."""

from __future__ import annotations

import os
from pathlib import Path

from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR
from ..gpus.cudaenv import parse_cuda_visible
from ..tf.runtime import ASYNC_ALLOCATOR
from .records import FAIL, INFO, JAX_CUDA_PLUGIN, OK, WARN, Check, Machine
from .tfbuild import read_build_info

TORCH_CUDA_FIX = ("pip uninstall -y torch && pip install torch (PyPI's Linux wheels are CUDA builds; another "
                  "CUDA version: https://pytorch.org/get-started/locally/), then restart the kernel")
JAX_CUDA_FIX = 'pip install -U "jax[cuda12]" (or "jax[cuda13]" with an NVIDIA driver 580 or newer), then restart the kernel'


def same_environment(python: str, other: str) -> bool:
    """Two interpreters of one environment live in one bin folder. Symlinks are not resolved: a
    venv's python links to its base interpreter, yet has other packages."""
    return Path(os.path.abspath(python)).parent == Path(os.path.abspath(other)).parent


def check_tensorflow(m: Machine) -> Check:
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


def check_python(m: Machine) -> Check | None:
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


def check_torch_build(m: Machine) -> Check | None:
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


def check_jax_build(m: Machine) -> Check | None:
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


def check_cuda_visible(m: Machine) -> Check:
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


def check_device_order(m: Machine) -> Check:
    order = m.environ.get(CUDA_DEVICE_ORDER)
    if order == "PCI_BUS_ID":
        return Check(CUDA_DEVICE_ORDER, OK, "PCI_BUS_ID: TensorFlow's GPU numbers match nvidia-smi's")
    return Check(CUDA_DEVICE_ORDER, INFO, f"{order or 'unset'} (CUDA's default: fastest first), so 'GPU 1' in TensorFlow "
                 "may be another card than nvidia-smi's GPU 1", "any `%tfgpu` GPU directive sets PCI_BUS_ID")


def check_forced_growth(m: Machine) -> Check | None:
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


def check_allocator(m: Machine) -> Check | None:
    if m.environ.get(TF_GPU_ALLOCATOR) != ASYNC_ALLOCATOR:
        return None
    if m.policy.limits or m.policy.splits:
        return Check(TF_GPU_ALLOCATOR, WARN, "cuda_malloc_async makes the memory limits soft, not hard caps",
                     "`%tfgpu allocator bfc` for hard caps")
    return Check(TF_GPU_ALLOCATOR, INFO, "cuda_malloc_async: memory is allocated on demand")

"""`%tfgpu doctor`: ordered checks over a hand-built `Machine` (fake inventory, fake TF state),
the build-info reader, the report on this very machine, and the magic on a real IPython shell.
TensorFlow is never imported in this process."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.terminal.interactiveshell import TerminalInteractiveShell
from IPython.testing import tools

from fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, UUIDS, FakeGpu, FakeNvml, OlderBinding, four_gpus
from tfgpu_magic.views import actions
from tfgpu_magic.views import doctor as doctor_view
from tfgpu_magic import doctor
from tfgpu_magic.tf import quietimport
from tfgpu_magic.controller import Controller
from tfgpu_magic.doctor import FAIL, INFO, OK, WARN, Machine
from tfgpu_magic.gpus.inventory import Inventory, Nvml, driver_present, read_inventory
from tfgpu_magic.views.magics import TFGPUMagics
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.tf.runtime import RuntimeState

CUDA_BUILD = ("build_info = collections.OrderedDict([('is_cuda_build', True), ('cuda_version', '12.5'), "
              "('cudnn_version', '9')])")
CPU_BUILD = "build_info = collections.OrderedDict([('is_cuda_build', False), ('is_rocm_build', False)])"
ARCHS_BUILD = ("build_info = collections.OrderedDict([('cuda_compute_capabilities', ['sm_60', 'sm_70', 'sm_80', "
               "'sm_89', 'compute_90']), ('cuda_version', '12.5.1'), ('cudnn_version', '9'), ('is_cuda_build', True)])")
"""TensorFlow 2.18-2.21's wheels (binaries up to Ada, PTX for Hopper and newer)."""
BINARIES_ONLY_BUILD = ARCHS_BUILD.replace("'compute_90'", "'sm_90'")
FOUR = read_inventory(Nvml(module=FakeNvml(four_gpus())))
NO_DRIVER = read_inventory(Nvml(module=FakeNvml(four_gpus(), init_error=NVML_ERROR_DRIVER_NOT_LOADED)))
NODES = ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidiactl")
CHECK = re.compile(r"^\[(?P<verdict>[ a-zA-Z]{4})\] (?P<name>[^:]+): (?P<detail>.*)$")


class FakeAPI:
    """The `ConfigAPI` calls the doctor makes; `gpus=None`: TensorFlow has not listed devices;
    `names`: what `get_device_details` says of each (None: no name, as on a non-NVIDIA device)."""

    def __init__(self, gpus: int | None = None, names: tuple[str, ...] | None = None) -> None:
        self.gpus = gpus
        self.names = names

    def details(self, device: str) -> dict[str, str]:
        assert self.gpus is not None, "the doctor asked for details before TensorFlow listed devices"
        if self.names == ():
            raise ValueError("The PhysicalDevice must be one obtained from calling `tf.config.list_physical_devices`")
        return {} if self.names is None else {"device_name": self.names[int(device.split(":")[1])]}

    def errors(self) -> tuple[type[BaseException], ...]:
        return ()

    def state(self) -> RuntimeState:
        listed = self.gpus is not None
        return RuntimeState(imported=listed, devices_listed=listed)

    def devices(self, kind: str) -> list[str]:
        assert kind == "GPU" and self.gpus is not None, "the doctor listed devices before TensorFlow did"
        return [f"GPU:{i}" for i in range(self.gpus)]


def write_tf(root: Path, source: str) -> Path:
    """A TensorFlow package directory whose python/platform/build_info.py holds `source`."""
    platform = root / "tensorflow" / "python" / "platform"
    platform.mkdir(parents=True, exist_ok=True)
    (platform / "build_info.py").write_text(f'"""Auto-generated module."""\nimport collections\n\n{source}\n')
    return root / "tensorflow"


@pytest.fixture
def tf_dirs(tmp_path: Path) -> dict[str, Path]:
    """TensorFlow directories of a CUDA build, a CPU-only build and one with a broken build_info.py."""
    return {"cuda": write_tf(tmp_path / "cuda", CUDA_BUILD), "cpu": write_tf(tmp_path / "cpu", CPU_BUILD),
            "broken": write_tf(tmp_path / "broken", "build_info = collections.OrderedDict([("),
            "archs": write_tf(tmp_path / "archs", ARCHS_BUILD),
            "binaries": write_tf(tmp_path / "binaries", BINARIES_ONLY_BUILD)}


def make_machine(tf_dirs: dict[str, Path], tf: str | None = "cuda", **changes) -> Machine:  # noqa: ANN003
    """A healthy GPU machine (CUDA build, four GPUs, TF lists all four), with `changes`."""
    base = Machine(
        environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        inventory=FOUR,
        policy=Policy(),
        api=FakeAPI(4),
        tf_dir=None if tf is None else tf_dirs[tf],
        tf_distribution="tensorflow 2.21.0",
        device_nodes=NODES,
        python="/opt/conda/bin/python3",
        path_python="/opt/conda/bin/python3",
        path_python_has_tf=True,
    )
    return dataclasses.replace(base, **changes)


def parse_report(text: str) -> tuple[list[tuple[str, str, str, str]], str]:
    """(verdict, name, detail, fix) per check line, and the closing summary."""
    body, blank, summary = text.rpartition("\n\n")
    assert blank and "\n" not in summary and summary.endswith(f" {doctor_view.SELFTEST_HINT}"), text
    summary = summary.removesuffix(f" {doctor_view.SELFTEST_HINT}")
    checks: list[list[str]] = []
    for line in body.splitlines():
        if line.startswith("       fix: "):
            assert checks and not checks[-1][3], f"a fix without its check: {line}"
            checks[-1][3] = line.removeprefix("       fix: ")
            continue
        match = CHECK.match(line)
        assert match, f"not a check line: {line!r}"
        checks.append([match["verdict"].strip(), match["name"], match["detail"], ""])
    return [tuple(c) for c in checks], summary


ORDER = ("platform", "NVIDIA driver / NVML", "device nodes", "CUDA libraries (pip)", "TensorFlow",
         "TensorFlow build", "Python", "GPU architecture", "PyTorch build", "JAX build", "CUDA_VISIBLE_DEVICES",
         "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "TensorFlow's GPUs", "GPU order")
"""What depends on what: the platform, the driver, the device nodes, the CUDA libraries, TensorFlow's
build (for this Python, for these cards), the other frameworks' builds, the variables that steer CUDA,
what TensorFlow lists."""
HEALTHY = {
    "TensorFlow build": (OK, "tensorflow 2.21.0, built with CUDA 12.5, cuDNN 9", ""),
    "NVIDIA driver / NVML": (OK, "driver 550.54.15, GPUs 0: NVIDIA A100-SXM4-80GB, 1: NVIDIA A100-SXM4-80GB, "
                                 "2: NVIDIA A100-SXM4-80GB, 3: NVIDIA A100-SXM4-40GB", ""),
    "device nodes": (OK, ", ".join(NODES), ""),
    "CUDA_VISIBLE_DEVICES": (OK, "not set: every GPU is visible", ""),
    "CUDA_DEVICE_ORDER": (OK, "PCI_BUS_ID: TensorFlow's GPU numbers match nvidia-smi's", ""),
    "Python": (OK, "the kernel runs /opt/conda/bin/python3, the same as `python3` on PATH", ""),
    "TensorFlow's GPUs": (OK, "TensorFlow lists 4 GPU(s)", ""),
}
TF_LISTS_NONE = {"TensorFlow's GPUs": (FAIL, "TensorFlow lists no GPU", "see the failed checks above")}
NOT_LISTED = {"TensorFlow's GPUs": (INFO, "not listed yet (listing starts CUDA", "tf.config.list_physical_devices")}
CPU_ONLY = {"TensorFlow build": (FAIL, "tensorflow-cpu 2.21.0 is a CPU-only build: it never uses a GPU",
                                 "pip uninstall tensorflow-cpu && pip install 'tensorflow[and-cuda]'"),
            "CUDA libraries (pip)": (INFO, "not needed: a CPU-only TensorFlow loads no CUDA library", "")}
NVML_FAILS = {"NVIDIA driver / NVML": (FAIL, "NVML could not start: Driver Not Loaded (no NVIDIA driver",
                                       "install the NVIDIA driver on the host (nvidia-smi must work)")}
NO_NODES = {"device nodes": (FAIL, "no /dev/nvidia0, /dev/nvidia1, ... in this machine or container",
                             "in Docker start with --gpus all")}
HIDES_ALL = "`%tfgpu visible all` (or `visible 0`) before importing TensorFlow, or unset it"
WEDGED = "run `nvidia-smi` in a terminal: if it hangs too, the driver is wedged, and `sudo dmesg | grep -i xid`"
STALE = FOUR._replace(stale_seconds=95.2, blocked_seconds=90.4, warning="the NVIDIA driver is not answering: …")
"""FOUR served as the last good reading while an NVML call hangs (tests/test_nvml_deadline.py makes them)."""


def env(**variables: str) -> dict[str, str]:
    """The healthy environment plus `variables`."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **variables}


ASYNC = env(TF_GPU_ALLOCATOR="cuda_malloc_async")


def scenario(name: str, changes: dict, differs: dict, summary: str | None = None, **bug: str):  # noqa: ANN201
    """A report scenario: machine `changes`, the lines that differ from HEALTHY (None: absent), and
    optionally the exact summary; `bug=` marks a known bug as a strict xfail."""
    marks = [pytest.mark.xfail(strict=True, reason=bug["bug"])] if bug else []
    return pytest.param(changes, differs, summary, id=name, marks=marks)


CVD_FAILS = "stops at its first entry"
A100S = ("NVIDIA A100-SXM4-80GB",) * 3 + ("NVIDIA A100-SXM4-40GB",)
"""FOUR's cards by name, nvidia-smi order."""
SCENARIOS = [
    scenario("cuda-build-all-fine", {}, {}, "Nothing stops TensorFlow from using the GPUs above."),
    scenario("cpu-only-build", dict(tf="cpu", tf_distribution="tensorflow-cpu 2.21.0", api=FakeAPI(0)),
             {**CPU_ONLY, **TF_LISTS_NONE},
             "TensorFlow has no GPU here because: TensorFlow build: tensorflow-cpu 2.21.0 is a CPU-only build: "
             "it never uses a GPU; TensorFlow's GPUs: TensorFlow lists no GPU. Fix the first one first."),
    scenario("container-without-gpus", dict(inventory=NO_DRIVER, device_nodes=(), api=FakeAPI(0)),
             {**NVML_FAILS, **NO_NODES, **TF_LISTS_NONE}),
    scenario("cvd-empty", dict(environ=env(CUDA_VISIBLE_DEVICES=""), api=FakeAPI(0)),
             {"CUDA_VISIBLE_DEVICES": (FAIL, "'' is empty: it hides every GPU", HIDES_ALL), **TF_LISTS_NONE}),
    scenario("cvd-minus-one", dict(environ=env(CUDA_VISIBLE_DEVICES="-1"), api=FakeAPI(0)),
             {"CUDA_VISIBLE_DEVICES": (FAIL, f"'-1' {CVD_FAILS} '-1': it hides every GPU", HIDES_ALL),
              **TF_LISTS_NONE}),
    scenario("cvd-missing-gpu", dict(environ=env(CUDA_VISIBLE_DEVICES="5,0"), api=FakeAPI(0)),
             {"CUDA_VISIBLE_DEVICES": (FAIL, f"'5,0' {CVD_FAILS} '5': it hides every GPU", HIDES_ALL),
              **TF_LISTS_NONE}),
    scenario("cvd-stops-midway", dict(environ=env(CUDA_VISIBLE_DEVICES="0,-1,1"), api=FakeAPI(1)),
             {"CUDA_VISIBLE_DEVICES": (WARN, "'0,-1,1' → GPUs 0; CUDA stops at '-1' and ignores the rest",
                                       "remove the invalid entry"),
              "TensorFlow's GPUs": (INFO, "TensorFlow lists 1, NVML sees 4 (CUDA_VISIBLE_DEVICES or the policy", "")},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("cvd-two-gpus", dict(environ=env(CUDA_VISIBLE_DEVICES="3, 1"), api=FakeAPI(2)),
             {"CUDA_VISIBLE_DEVICES": (OK, "'3, 1' → GPUs 3, 1", ""),
              "TensorFlow's GPUs": (INFO, "TensorFlow lists 2, NVML sees 4", "")}),
    scenario("device-order-unset", dict(environ={}),
             {"CUDA_DEVICE_ORDER": (INFO, "unset (CUDA's default: fastest first), so 'GPU 1' in TensorFlow may be "
                                          "another card than nvidia-smi's GPU 1",
                                    "any `%tfgpu` GPU directive sets PCI_BUS_ID")}),
    scenario("device-order-fastest", dict(environ={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}),
             {"CUDA_DEVICE_ORDER": (INFO, "FASTEST_FIRST (CUDA's default: fastest first)", "sets PCI_BUS_ID")}),
    scenario("tf-only-on-path-python", dict(tf=None, python="/usr/bin/python3", api=FakeAPI()),
             {"TensorFlow build": None,
              "TensorFlow": (FAIL, "not installed for this kernel's Python (/usr/bin/python3)",
                             "/usr/bin/python3 -m pip install tensorflow"),
              "Python": (FAIL, "the kernel runs /usr/bin/python3, `python3` on PATH is /opt/conda/bin/python3; "
                               "TensorFlow is installed for that one, not for the kernel's",
                         "`%pip install tensorflow` from the notebook"),
              **NOT_LISTED},
             "TensorFlow has no GPU here because: TensorFlow: not installed for this kernel's Python "
             "(/usr/bin/python3); Python: the kernel runs /usr/bin/python3, `python3` on PATH is "
             "/opt/conda/bin/python3; TensorFlow is installed for that one, not for the kernel's. "
             "Fix the first one first."),
    scenario("other-python-on-path", dict(python="/srv/venv/bin/python"),
             {"Python": (INFO, "the kernel runs /srv/venv/bin/python, `python3` on PATH is /opt/conda/bin/python3",
                         "")}),
    scenario("forced-growth-vs-policy-off",
             dict(environ=env(TF_FORCE_GPU_ALLOW_GROWTH="true"), policy=Policy(growth=False)),
             {"TF_FORCE_GPU_ALLOW_GROWTH": (WARN, "=true overrides the policy's growth off",
                                            "unset it, or `%tfgpu growth on`")}),
    scenario("forced-no-growth-vs-policy-on",
             dict(environ=env(TF_FORCE_GPU_ALLOW_GROWTH="false"), policy=Policy(growth=True)),
             {"TF_FORCE_GPU_ALLOW_GROWTH": (WARN, "=false overrides the policy's growth on",
                                            "unset it, or `%tfgpu growth off`")}),
    scenario("forced-growth-agrees",
             dict(environ=env(TF_FORCE_GPU_ALLOW_GROWTH="true"), policy=Policy(growth=True, limits=(("all", 1024),))),
             {"TF_FORCE_GPU_ALLOW_GROWTH": (INFO, "=true: every GPU allocator uses it", "")}),
    scenario("forced-growth-misspelt", dict(environ=env(TF_FORCE_GPU_ALLOW_GROWTH="1")),
             {"TF_FORCE_GPU_ALLOW_GROWTH": (WARN, "='1': TensorFlow only reads 'true' or 'false'", "")}),
    scenario("async-with-limit", dict(environ=ASYNC, policy=Policy(allocator="async", limits=(("0", 2048),))),
             {"TF_GPU_ALLOCATOR": (WARN, "cuda_malloc_async makes the memory limits soft, not hard caps",
                                   "`%tfgpu allocator bfc` for hard caps")}),
    scenario("async-with-split", dict(environ=ASYNC, policy=Policy(allocator="async", splits=(("1", (512, 512)),))),
             {"TF_GPU_ALLOCATOR": (WARN, "makes the memory limits soft", "`%tfgpu allocator bfc`")}),
    scenario("async-alone", dict(environ=ASYNC, policy=Policy(allocator="async")),
             {"TF_GPU_ALLOCATOR": (INFO, "cuda_malloc_async: memory is allocated on demand", "")}),
    scenario("tf-lists-fewer", dict(api=FakeAPI(2)),
             {"TensorFlow's GPUs": (INFO, "TensorFlow lists 2, NVML sees 4", "")},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("tf-not-listed-yet", dict(api=FakeAPI()), NOT_LISTED),
    scenario("no-nvml-binding",
             dict(inventory=Inventory(error="nvidia-ml-py is not installed (`pip install nvidia-ml-py`)")),
             {"NVIDIA driver / NVML": (WARN, "nvidia-ml-py is not installed", "pip install nvidia-ml-py")},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("driver-not-answering-stale-figures", dict(inventory=STALE),
             {"NVIDIA driver / NVML": (FAIL, "the NVIDIA driver is not answering: an NVML call has waited 90 s; the "
                                             "GPU figures shown are 95 s old", WEDGED)},
             "TensorFlow has no GPU here because: NVIDIA driver / NVML: the NVIDIA driver is not answering: an NVML "
             "call has waited 90 s; the GPU figures shown are 95 s old. Fix the first one first."),
    scenario("driver-not-answering-no-reading",
             dict(inventory=Inventory(error="the NVIDIA driver is not answering: …", blocked_seconds=3.1),
                  api=FakeAPI(0)),
             {"NVIDIA driver / NVML": (FAIL, "the NVIDIA driver is not answering: an NVML call has waited 3 s",
                                       "only a GPU reset (`sudo nvidia-smi -r -i N`, with no process on that card) "
                                       "or a reboot clears it: ask the machine's admin"),
              **TF_LISTS_NONE}),
    scenario("nvml-sees-no-gpu", dict(inventory=read_inventory(Nvml(module=FakeNvml([]))), api=FakeAPI(0)),
             {"NVIDIA driver / NVML": (FAIL, "driver 550.54.15, GPUs none", "NVML works but lists no GPU"),
              **TF_LISTS_NONE}),
    scenario("driver-missing-binding-installed", dict(inventory=NO_DRIVER, device_nodes=(), api=FakeAPI(0)),
             {**NVML_FAILS, **NO_NODES, **TF_LISTS_NONE}),
    scenario("driver-and-binding-missing", dict(inventory=NO_DRIVER, device_nodes=(), api=FakeAPI(0), nvml_binding=False),
             {"NVIDIA driver / NVML": (FAIL, "NVML could not start", "for this tool's inventory: pip install nvidia-ml-py"),
              **NO_NODES, **TF_LISTS_NONE}),
    scenario("gpu-order-matches", dict(api=FakeAPI(4, names=A100S)),
             {"GPU order": (OK, "TensorFlow's GPUs are the cards nvidia-smi numbers the same", "")}),
    scenario("gpu-order-fastest-first", dict(api=FakeAPI(4, names=A100S[::-1])),
             {"GPU order": (WARN, "TensorFlow's GPU:0 is a NVIDIA A100-SXM4-40GB, but the card in that place in "
                                  "nvidia-smi's order is GPU 0 (NVIDIA A100-SXM4-80GB, bus 00000000:07:00.0): CUDA "
                                  "numbered the GPUs fastest first", "sets CUDA_DEVICE_ORDER=PCI_BUS_ID before CUDA")}),
    scenario("gpu-order-under-cuda-visible", dict(environ=env(CUDA_VISIBLE_DEVICES="3,1"),
                                                  api=FakeAPI(2, names=(A100S[3], A100S[1]))),
             {"CUDA_VISIBLE_DEVICES": (OK, "'3,1' → GPUs 3, 1", ""),
              "TensorFlow's GPUs": (INFO, "TensorFlow lists 2, NVML sees 4", ""),
              "GPU order": (OK, "TensorFlow's GPUs are the cards nvidia-smi numbers the same", "")}),
    scenario("gpu-order-one-model-cannot-tell", dict(api=FakeAPI(3, names=A100S[:3]),
                                                     environ=env(CUDA_VISIBLE_DEVICES="0,1,2")),
             {"CUDA_VISIBLE_DEVICES": (OK, "'0,1,2' → GPUs 0, 1, 2", ""),
              "TensorFlow's GPUs": (INFO, "TensorFlow lists 3, NVML sees 4", "")}),
    scenario("gpu-details-refused", dict(api=FakeAPI(4, names=())), {}),
    scenario("build-info-unreadable", dict(tf="broken"),
             {"TensorFlow build": None, "TensorFlow": (WARN, "tensorflow 2.21.0; build info unreadable: ", "")}),
    scenario("unknown-distribution", dict(tf_distribution=None),
             {"TensorFlow build": (OK, "TensorFlow, built with CUDA 12.5, cuDNN 9", "")}),
]


def cards(*gpus: FakeGpu) -> dict:
    """Machine changes for `gpus` (each FakeGpu with its compute capability): the inventory and the
    capabilities both read through `doctor.read_compute_capabilities` from the fake NVML."""
    nvml = Nvml(module=FakeNvml(list(gpus)))
    inventory = read_inventory(nvml)
    return dict(inventory=inventory, compute_capabilities=doctor.read_compute_capabilities(inventory, nvml),
                api=FakeAPI(len(gpus)))


RTX_5090 = FakeGpu(UUIDS[0], name="NVIDIA GeForce RTX 5090", total_mib=32607, mig=None, compute_capability=(12, 0))
K80 = FakeGpu(UUIDS[1], name="Tesla K80", bus_id="00000000:0F:00.0", total_mib=11441, mig=None,
              compute_capability=(3, 7))
A100_CC = cards(*four_gpus())
ARCHS_LINE = {"TensorFlow build": (OK, "tensorflow 2.21.0, built with CUDA 12.5.1, cuDNN 9", "")}
BUILT_FOR = "TensorFlow has kernels for sm_60, sm_70, sm_80, sm_89, compute_90; "
ONE_GPU = {"TensorFlow's GPUs": (OK, "TensorFlow lists 1 GPU(s)", "")}
NEWER_TF = "`pip install 'tf-nightly[and-cuda]'` or NVIDIA's NGC TensorFlow container"

SITE = "/srv/venv/lib/python3.12/site-packages"
PIP_CUDA = {"nvidia-cublas-cu12": "12.5.3.2", "nvidia-cuda-runtime-cu12": "12.5.82", "nvidia-cudnn-cu12": "9.3.0.75"}
LIB_DIRS = tuple(f"{SITE}/nvidia/{name}/lib" for name in ("cublas", "cuda_runtime", "cudnn"))
ON_PATH = ":".join(LIB_DIRS)
PIP = dict(cuda_packages=PIP_CUDA, cuda_lib_dirs=LIB_DIRS, loader_path="")
PIP_NAME = "CUDA libraries (pip)"
HAVE = "3 packages of tensorflow[and-cuda] installed"
EXPORT = f"export LD_LIBRARY_PATH={ON_PATH}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}, then restart the kernel"
WSL2 = "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc (GCC) 11.2.0) #1 SMP"
WSL1 = "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com) (gcc version 5.4.0 (GCC) ) #1237-Microsoft"
NO_GPU_HERE = dict(inventory=NO_DRIVER, device_nodes=(), api=FakeAPI(0))
TORCH_CPU = {"__version__": "2.13.0+cpu", "cuda": None, "hip": None}
TORCH_CU130 = {"__version__": "2.14.1+cu130", "cuda": "13.0", "hip": None}
"""`torch.version` of the two PyTorch wheels on this project's machines: the CPU build, and PyPI's CUDA one."""
JAX_CPU = {"jax": "0.10.2", "jaxlib": "0.10.2"}

SCENARIOS += [
    # tensorflow[and-cuda]: the pip CUDA packages and the loader (the changes decide what is installed)
    scenario("pip-cuda-on-ld-path", dict(PIP, loader_path=ON_PATH, environ=env(LD_LIBRARY_PATH=ON_PATH)),
             {PIP_NAME: (OK, f"{HAVE}, their lib folders on LD_LIBRARY_PATH", "")}),
    scenario("pip-cuda-missing", dict(PIP, cuda_packages={**PIP_CUDA, "nvidia-cudnn-cu12": None}, api=FakeAPI(0)),
             {PIP_NAME: (FAIL, "1 of the 3 packages of tensorflow[and-cuda] not installed: nvidia-cudnn-cu12 (needed "
                               "unless CUDA 12.5 and cuDNN 9 are installed system-wide)",
                         "pip install 'tensorflow[and-cuda]==2.21.0'"), **TF_LISTS_NONE}),
    scenario("pip-cuda-missing-system-cuda-loaded",
             dict(PIP, cuda_packages={**PIP_CUDA, "nvidia-cudnn-cu12": None},
                  loaded_libraries=("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.1.0",)),
             {PIP_NAME: (OK, "nvidia-cudnn-cu12 not from pip, but loaded: libcudnn.so.9.1.0", "")}),
    scenario("pip-cuda-not-on-ld-path", PIP,
             {PIP_NAME: (WARN, f"{HAVE}, but 3 of their lib folders are not on LD_LIBRARY_PATH: TensorFlow 2.16+ "
                               "may then not find them and list no GPU (tensorflow#63362, #65842)",
                         f"before starting Jupyter (or in the kernelspec's env): {EXPORT}")},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("pip-cuda-ld-path-set-too-late", dict(PIP, environ=env(LD_LIBRARY_PATH=ON_PATH)),
             {PIP_NAME: (WARN, f"{HAVE}, but 3 of their lib folders are not on LD_LIBRARY_PATH as this process "
                               "started (it was changed since; the loader reads it only at start)", EXPORT)}),
    scenario("pip-cuda-partly-on-ld-path", dict(PIP, loader_path=f"{LIB_DIRS[0]}/:/usr/local/cuda/lib64"),
             {PIP_NAME: (WARN, f"{HAVE}, but 2 of their lib folders are not on LD_LIBRARY_PATH",
                         f"export LD_LIBRARY_PATH={LIB_DIRS[1]}:{LIB_DIRS[2]}$")}),
    scenario("pip-cuda-loaded", dict(PIP, loaded_libraries=(f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9",
                                                            f"{SITE}/nvidia/cublas/lib/libcublas.so.12")),
             {PIP_NAME: (OK, f"{HAVE}; loaded: libcublas.so.12, libcudnn.so.9", "")}),
    scenario("pip-cuda-tf-2-15", dict(PIP, tf_distribution="tensorflow 2.15.1"),
             {PIP_NAME: (OK, f"{HAVE}; TensorFlow 2.15 finds them by itself", ""),
              "TensorFlow build": (OK, "tensorflow 2.15.1, built with CUDA 12.5", "")}),
    scenario("pip-cuda-nightly", dict(PIP, tf_distribution="tf-nightly 2.21.0.dev20250729"),
             {PIP_NAME: (WARN, "3 packages of tf-nightly[and-cuda] installed, but",
                         "before starting Jupyter"),
              "TensorFlow build": (OK, "tf-nightly 2.21.0.dev20250729, built with CUDA 12.5", "")}),
    # compute capability against build_info's cuda_compute_capabilities (FakeNvml decides the cards)
    scenario("arch-a100s-have-binaries", dict(A100_CC, tf="archs"),
             {**ARCHS_LINE, "GPU architecture": (OK, BUILT_FOR + "GPU 0 (NVIDIA A100-SXM4-80GB, 8.0): sm_80, GPU 1 "
                                                 "(NVIDIA A100-SXM4-80GB, 8.0): sm_80, GPU 2 (NVIDIA A100-SXM4-80GB, "
                                                 "8.0): sm_80, GPU 3 (NVIDIA A100-SXM4-40GB, 8.0): sm_80", "")}),
    scenario("arch-blackwell-only-ptx", dict(cards(RTX_5090), tf="archs"),
             {**ARCHS_LINE, **ONE_GPU,
              "NVIDIA driver / NVML": (OK, "driver 550.54.15, GPUs 0: NVIDIA GeForce RTX 5090", ""),
              "GPU architecture": (WARN, BUILT_FOR + "GPU 0 (NVIDIA GeForce RTX 5090, 12.0): compute_90: the driver "
                                   "compiles TensorFlow's PTX at the first start (minutes), and it can fail "
                                   "(CUDA_ERROR_INVALID_PTX)",
                                   "set CUDA_CACHE_MAXSIZE=4294967296 to keep the compiled kernels; for native ones "
                                   "`pip install -U 'tensorflow[and-cuda]'` if a release is built for compute "
                                   "capability 12.0, else " + NEWER_TF)},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("arch-blackwell-no-kernel", dict(cards(RTX_5090), tf="binaries"),
             {**ARCHS_LINE, **ONE_GPU,
              "NVIDIA driver / NVML": (OK, "driver 550.54.15, GPUs 0: NVIDIA GeForce RTX 5090", ""),
              "GPU architecture": (FAIL, "TensorFlow has kernels for sm_60, sm_70, sm_80, sm_89, sm_90; GPU 0 (NVIDIA "
                                   "GeForce RTX 5090, 12.0): none: TensorFlow cannot run a kernel there", NEWER_TF)}),
    scenario("arch-kepler-too-old", dict(cards(K80), tf="archs"),
             {**ARCHS_LINE, **ONE_GPU,
              "NVIDIA driver / NVML": (OK, "driver 550.54.15, GPUs 0: Tesla K80", ""),
              "GPU architecture": (FAIL, BUILT_FOR + "GPU 0 (Tesla K80, 3.7): none: this TensorFlow needs 6.0 or newer",
                                   "an older TensorFlow built for that card")}),
    scenario("arch-unknown-without-build-list", dict(A100_CC), {}),
    # platforms
    scenario("windows-native", dict(platform="win32", device_nodes=()),
             {"platform": (FAIL, "native Windows: TensorFlow's GPU support ended with 2.10; newer releases run on "
                                 "the CPU only", "run Jupyter inside WSL2 (Ubuntu)"), "device nodes": None}),
    scenario("windows-native-tf-2-10", dict(platform="win32", device_nodes=(), tf_distribution="tensorflow-gpu 2.10.1"),
             {"platform": (INFO, "native Windows with TensorFlow 2.10: its GPU build needs CUDA 11.2 and cuDNN 8.1", ""),
              "device nodes": None,
              "TensorFlow build": (OK, "tensorflow-gpu 2.10.1, built with CUDA", "")}),
    scenario("macos", dict(platform="darwin", **NO_GPU_HERE),
             {"platform": (FAIL, "macOS has no CUDA", "pip install tensorflow-metal"), "device nodes": None,
              **NVML_FAILS, **TF_LISTS_NONE}),
    scenario("wsl2-with-gpu", dict(kernel_version=WSL2, device_nodes=("/dev/dxg",)),
             {"platform": (OK, "WSL2 with a GPU passed through (/dev/dxg); the driver is the Windows one", ""),
              "device nodes": (OK, "/dev/dxg: a GPU passed through by WSL2", "")}),
    scenario("wsl2-without-dxg", dict(kernel_version=WSL2, **NO_GPU_HERE),
             {"platform": (FAIL, "WSL2 without /dev/dxg: Windows passes no GPU to this distribution",
                           "install the current NVIDIA driver in Windows (it includes WSL support), `wsl --update`"),
              **NVML_FAILS, **NO_NODES, **TF_LISTS_NONE}),
    scenario("wsl1", dict(kernel_version=WSL1, **NO_GPU_HERE),
             {"platform": (FAIL, "WSL1: it passes no GPU to Linux", "wsl --set-version <distro> 2"),
              **NVML_FAILS, **NO_NODES, **TF_LISTS_NONE}),
    # the other frameworks' builds: a warning with its fix, never a reason TensorFlow has no GPU
    scenario("torch-cuda-build", dict(torch_build=TORCH_CU130),
             {"PyTorch build": (OK, "torch 2.14.1+cu130, built with CUDA 13.0", "")}),
    scenario("torch-cpu-build", dict(torch_build=TORCH_CPU),
             {"PyTorch build": (WARN, "torch 2.13.0+cpu is a CPU-only build: PyTorch never uses an NVIDIA GPU",
                                "pip uninstall -y torch && pip install torch (PyPI's Linux wheels are CUDA builds")},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("torch-rocm-build", dict(torch_build={**TORCH_CPU, "__version__": "2.13.0+rocm6.4", "hip": "6.4.1"}),
             {"PyTorch build": (WARN, "torch 2.13.0+rocm6.4 is a ROCm build (HIP 6.4.1): PyTorch never uses an "
                                      "NVIDIA GPU", "https://pytorch.org/get-started/locally/")}),
    scenario("torch-version-unreadable", dict(torch_build={}),
             {"PyTorch build": (WARN, "installed; its torch/version.py is unreadable", "")}),
    scenario("jax-cpu-only", dict(jax_packages=JAX_CPU),
             {"JAX build": (WARN, "jax 0.10.2, jaxlib 0.10.2, no CUDA plugin: JAX runs on the CPU only",
                            'pip install -U "jax[cuda12]" (or "jax[cuda13]" with an NVIDIA driver 580 or newer)')},
             "Nothing stops TensorFlow from using the GPUs above."),
    scenario("jax-cuda12-plugin", dict(jax_packages={**JAX_CPU, "jax-cuda12-plugin": "0.10.2",
                                                     "jax-cuda12-pjrt": "0.10.2"}),
             {"JAX build": (OK, "jax 0.10.2, jaxlib 0.10.2, jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2", "")}),
    scenario("jax-plugin-of-another-version", dict(jax_packages={"jax": "0.8.1", "jaxlib": "0.8.1",
                                                                 "jax-cuda12-plugin": "0.7.2", "jax-cuda12-pjrt": "0.7.2"}),
             {"JAX build": (WARN, "jax 0.8.1, jaxlib 0.8.1, jax-cuda12-pjrt 0.7.2, jax-cuda12-plugin 0.7.2: "
                                  "jax-cuda12-pjrt, jax-cuda12-plugin not of jaxlib's version, so JAX leaves its CUDA "
                                  "plugin out and runs on the CPU only", 'pip install -U "jax[cuda12]"')}),
    scenario("jax-pjrt-missing", dict(jax_packages={**JAX_CPU, "jax-cuda13-plugin": "0.10.2"}),
             {"JAX build": (WARN, "jax 0.10.2, jaxlib 0.10.2, jax-cuda13-plugin 0.10.2, but jax-cuda13-pjrt missing: "
                                  "JAX runs on the CPU only", 'pip install -U "jax[cuda13]", then restart the kernel')}),
    scenario("jaxlib-cuda-build", dict(jax_packages={"jax": "0.4.26", "jaxlib": "0.4.26+cuda12.cudnn89"}),
             {"JAX build": (OK, "jax 0.4.26, jaxlib 0.4.26+cuda12.cudnn89 (a CUDA build of jaxlib)", "")}),
    scenario("both-frameworks-cpu-only", dict(torch_build=TORCH_CPU, jax_packages=JAX_CPU),
             {"PyTorch build": (WARN, "is a CPU-only build", "pip install torch"),
              "JAX build": (WARN, "no CUDA plugin", "jax[cuda12]")},
             "Nothing stops TensorFlow from using the GPUs above."),
    # a machine without a GPU and the CPU-only build: the driver comes first, not `pip install tensorflow[and-cuda]`
    scenario("no-gpu-and-cpu-build", dict(NO_GPU_HERE, tf="cpu", tf_distribution="tensorflow-cpu 2.21.0"),
             {**NVML_FAILS, **NO_NODES, **CPU_ONLY, **TF_LISTS_NONE},
             "TensorFlow has no GPU here because: NVIDIA driver / NVML: NVML could not start: Driver Not Loaded (no "
             "NVIDIA driver, or no GPU in this container); device nodes: no /dev/nvidia0, /dev/nvidia1, ... in this "
             "machine or container; TensorFlow build: tensorflow-cpu 2.21.0 is a CPU-only build: it never uses a GPU; "
             "TensorFlow's GPUs: TensorFlow lists no GPU. Fix the first one first."),
]


@pytest.mark.parametrize("changes, differs, summary", SCENARIOS)
def test_report_line_by_line(tf_dirs, changes: dict, differs: dict, summary: str | None) -> None:
    """Every check line in order (verdict, name, detail, fix), then the closing sentence."""
    changes = dict(changes)
    machine = make_machine(tf_dirs, changes.pop("tf", "cuda"), **changes)
    checks, said = parse_report(doctor_view.report_text(doctor.run_checks(machine)))
    wanted = {**HEALTHY, **differs}
    expected = [(name, *wanted[name]) for name in ORDER if wanted.get(name) is not None]
    assert [(verdict, name) for verdict, name, _, _ in checks] == [(verdict, name) for name, verdict, _, _ in expected]
    for (_, name, detail, fix), (_, _, want_detail, want_fix) in zip(checks, expected):
        assert want_detail in detail, name
        assert (want_fix in fix) if want_fix else fix == "", name
    failed = [f"{name}: {detail}" for verdict, name, detail, _ in checks if verdict == FAIL]
    assert said == (f"TensorFlow has no GPU here because: {'; '.join(failed)}. Fix the first one first."
                    if failed else "Nothing stops TensorFlow from using the GPUs above.")
    if summary is not None:
        assert said == summary


@pytest.mark.parametrize(
    "nodes, verdict",
    [
        ((), FAIL),
        (("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"), FAIL),
        (("/dev/nvidia0",), OK),
        (("/dev/nvidia-caps", "/dev/nvidia12", "/dev/nvidiactl"), OK),
    ],
)
def test_device_nodes_need_a_numbered_node(tf_dirs, nodes: tuple[str, ...], verdict: str) -> None:
    """Only /dev/nvidiaN proves a GPU is attached; control nodes alone do not."""
    checks = {c.name: c for c in doctor.run_checks(make_machine(tf_dirs, device_nodes=nodes))}
    assert checks["device nodes"].verdict == verdict


def test_python_check_tells_a_venv_from_its_base(tf_dirs) -> None:
    """A venv's `python` is a symlink to the base interpreter, yet another environment (other packages):
    the check compares bin folders without resolving symlinks, so the two are told apart."""
    base = str(Path(sys.executable).resolve())
    if base == sys.executable or sys.prefix == sys.base_prefix:
        pytest.skip("this Python is not a venv over a base interpreter")
    machine = make_machine(tf_dirs, python=sys.executable, path_python=base, path_python_has_tf=False)
    checks = {c.name: c for c in doctor.run_checks(machine)}
    assert checks["Python"].verdict == INFO and f"`python3` on PATH is {base}" in checks["Python"].detail


def test_python_check_without_python_on_path(tf_dirs) -> None:
    """No `python3` on PATH is not 'the same': the check says there is none, as information."""
    checks = {c.name: c for c in doctor.run_checks(make_machine(tf_dirs, path_python=None))}
    assert "the same as" not in checks["Python"].detail
    assert checks["Python"].verdict == INFO and "there is no `python3` on PATH" in checks["Python"].detail


def test_python_check_same_bin_folder_is_the_same(tf_dirs) -> None:
    """`python3` on PATH next to the kernel's `python` (one bin folder) is the same environment."""
    machine = make_machine(tf_dirs, python="/srv/venv/bin/python", path_python="/srv/venv/bin/python3")
    check = {c.name: c for c in doctor.run_checks(machine)}["Python"]
    assert (check.verdict, check.detail) == (OK, "the kernel runs /srv/venv/bin/python, the same as `python3` on PATH")


def test_has_tensorflow_asks_the_other_python() -> None:
    """Whether the venv's base interpreter has TensorFlow is asked of that interpreter, not answered
    for this process (the two are different environments though one links to the other)."""
    base = str(Path(sys.executable).resolve())
    if base == sys.executable:
        pytest.skip("this Python is not a symlink into a base interpreter")
    probe = "import importlib.util,sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"
    truth = subprocess.run([base, "-c", probe], capture_output=True, timeout=30).returncode == 0
    if truth == (importlib.util.find_spec("tensorflow") is not None):
        pytest.skip("the base interpreter and this venv agree; the test cannot tell who answered")
    assert doctor._has_tensorflow(base) is truth


# ----- build info ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, info",
    [
        (CUDA_BUILD, {"is_cuda_build": True, "cuda_version": "12.5", "cudnn_version": "9"}),
        (CPU_BUILD, {"is_cuda_build": False, "is_rocm_build": False}),
        ("build_info = {'is_cuda_build': True, 'cuda_version': '11.8'}",
         {"is_cuda_build": True, "cuda_version": "11.8"}),
        ("version = '2.21'\nother = 1", {}),
    ],
    ids=["cuda", "cpu", "dict-literal", "no-build-info"],
)
def test_read_build_info(tmp_path: Path, source: str, info: dict) -> None:
    """TensorFlow's `build_info` literal, as a dict."""
    assert doctor.read_build_info(write_tf(tmp_path, source)) == info


def test_read_build_info_never_executes(tmp_path: Path) -> None:
    """A build_info.py that would leave a marker and raise if executed still parses, and runs nothing."""
    marker = tmp_path / "executed"
    hostile = f"open({str(marker)!r}, 'w').close()\nimport no_such_module_anywhere\nraise SystemExit(3)\n{CUDA_BUILD}"
    assert doctor.read_build_info(write_tf(tmp_path, hostile))["is_cuda_build"] is True
    assert not marker.exists()


@pytest.mark.parametrize(
    "source, error",
    [(None, OSError), ("build_info = collections.OrderedDict([(", SyntaxError),
     ("build_info = collections.OrderedDict(make_pairs())", ValueError)],
    ids=["missing", "syntax", "not-a-literal"],
)
def test_read_build_info_errors(tmp_path: Path, source: str | None, error: type) -> None:
    """Unreadable build info raises what `_check_tensorflow` turns into a warning."""
    tf_dir = tmp_path / "tensorflow" if source is None else write_tf(tmp_path, source)
    with pytest.raises(error):
        doctor.read_build_info(tf_dir)


def test_read_build_info_of_installed_tensorflow() -> None:
    """The TensorFlow installed here (tensorflow-cpu) reads as a CPU-only build, without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None:
        pytest.skip("TensorFlow is not installed")
    assert doctor.read_build_info(Path(spec.origin).parent)["is_cuda_build"] is False
    assert "tensorflow" not in sys.modules


# ----- this machine ---------------------------------------------------------------------------------
THIS_MACHINE = pytest.mark.skipif(
    any(Path("/dev").glob("nvidia[0-9]*")) or driver_present()
    or not all(map(importlib.util.find_spec, ("tensorflow", "pynvml"))),
    reason="expects this driverless machine with tensorflow-cpu and nvidia-ml-py installed",
)


@pytest.fixture
def python_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH holds only this interpreter's bin directory, so `python3` on PATH is the kernel's own."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))


@THIS_MACHINE
@pytest.mark.usefixtures("python_on_path")
def test_doctor_on_this_machine() -> None:
    """No NVML, no device nodes, CPU-only build: all FAIL, the driver first, and the summary names all three."""
    controller = Controller(environ={})
    checks, summary = parse_report(str(actions.doctor(controller)))
    frameworks = [(name, verdict, detail) for verdict, name, detail, _ in checks if name in FRAMEWORK_CHECKS]
    assert frameworks == this_machines_framework_builds()
    checks = [check for check in checks if check[1] not in FRAMEWORK_CHECKS]
    assert [(verdict, name) for verdict, name, _, _ in checks] == [
        (FAIL, "NVIDIA driver / NVML"), (FAIL, "device nodes"), (INFO, "CUDA libraries (pip)"),
        (FAIL, "TensorFlow build"), (OK, "Python"), (OK, "CUDA_VISIBLE_DEVICES"), (INFO, "CUDA_DEVICE_ORDER"),
        (INFO, "TensorFlow's GPUs")]
    nvml, nodes, pip, build, python, visible, order, listed = (detail for _, _, detail, _ in checks)
    assert pip == "not needed: a CPU-only TensorFlow loads no CUDA library"
    assert build.startswith("tensorflow-cpu ") and build.endswith(" is a CPU-only build: it never uses a GPU")
    assert nvml.startswith("NVML unavailable: no NVIDIA driver here (none of /proc/driver/nvidia")
    assert nodes.startswith("no /dev/nvidia0") and visible == "not set: every GPU is visible"
    assert order.startswith("unset (CUDA's default") and listed.startswith("not listed yet")
    assert python == f"the kernel runs {sys.executable}, the same as `python3` on PATH"
    assert summary.startswith("TensorFlow has no GPU here because: NVIDIA driver / NVML: NVML unavailable")
    assert all(f"{name}: " in summary for name in ("device nodes", "TensorFlow build"))
    assert summary.endswith(". Fix the first one first.")
    assert "tensorflow" not in sys.modules and controller.environ == {}
    assert "pip install nvidia-ml-py" not in str(actions.doctor(controller))  # it is installed here


FRAMEWORK_CHECKS = ("PyTorch build", "JAX build")


def this_machines_framework_builds() -> list[tuple[str, str, str]]:
    """(check, verdict, detail) the doctor owes this machine for PyTorch and JAX, from their metadata
    (found, not imported): a CPU build of either is a warning; one not installed has no line."""
    expected = []
    if importlib.util.find_spec("torch") is not None:
        version = importlib.metadata.version("torch")
        assert version.endswith("+cpu"), "expects the CPU wheel of PyTorch here"
        expected.append(("PyTorch build", WARN, f"torch {version} is a CPU-only build: PyTorch never uses an NVIDIA GPU"))
    if importlib.util.find_spec("jax") is not None:
        if importlib.util.find_spec("jax_plugins") is not None:
            pytest.skip("a JAX plugin is installed here: expects JAX's CPU build")
        jax, jaxlib = importlib.metadata.version("jax"), importlib.metadata.version("jaxlib")
        expected.append(("JAX build", WARN, f"jax {jax}, jaxlib {jaxlib}, no CUDA plugin: JAX runs on the CPU only"))
    return expected


@pytest.fixture
def shell() -> InteractiveShell:
    """The process's one IPython shell. If no test made it yet, make it as IPython's `globalipapp` does
    (a TerminalInteractiveShell with the test config), without calling `start_ipython`: that runs only
    once per process and tests/test_magic.py needs its own first call to return the shell. A plain
    `InteractiveShell` singleton would make the TerminalInteractiveShell there a MultipleInstanceError."""
    if not InteractiveShell.initialized():
        config = tools.default_config()
        config.TerminalInteractiveShell.simple_prompt = True
        TerminalInteractiveShell.instance(config=config).tempfiles.append(Path(config.HistoryManager.hist_file))
    return InteractiveShell.instance()


@pytest.fixture
def magic(shell: InteractiveShell) -> Iterator[Controller]:
    """The real shell with `%tfgpu` over a fresh controller (empty environment); the shell's own
    magics come back afterwards, and TensorFlow was never imported."""
    previous = shell.magics_manager.registry.get("TFGPUMagics")
    controller = Controller(environ={})
    shell.register_magics(TFGPUMagics(shell, controller=controller))
    try:
        yield controller
    finally:
        quietimport.disarm()
        if previous is not None:
            shell.register_magics(previous)
    assert "tensorflow" not in sys.modules


@THIS_MACHINE
@pytest.mark.usefixtures("python_on_path")
def test_magic_doctor_and_visible_auto(shell: InteractiveShell, magic: Controller,
                                       capsys: pytest.CaptureFixture) -> None:
    """On a real shell: `%tfgpu doctor` prints the report; `%tfgpu visible auto` is a UsageError here."""
    capsys.readouterr()
    shell.run_line_magic("tfgpu", "doctor")
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] NVIDIA driver / NVML: NVML unavailable: no NVIDIA driver here")
    assert "\n[FAIL] TensorFlow build: tensorflow-cpu" in out
    assert "\nTensorFlow has no GPU here because: " in out
    with pytest.raises(UsageError, match="`visible auto` needs the GPU inventory, which is unavailable: NVML"):
        shell.run_line_magic("tfgpu", "visible auto")
    assert magic.policy == Policy() and magic.environ == {}


def test_without_driver_and_device_nodes_the_first_fix_is_the_driver(tf_dirs) -> None:
    """The reported case: no driver, no /dev/nvidia*, tensorflow-cpu. The first failing check (the one
    "fix the first one first" points at) is the driver's, with the driver/container fix, not the
    reinstall of TensorFlow; the CPU-only build still fails, after the device nodes."""
    machine = make_machine(tf_dirs, "cpu", tf_distribution="tensorflow-cpu 2.21.0", **NO_GPU_HERE)
    failed = [c for c in doctor.run_checks(machine) if c.verdict == FAIL]
    assert [c.name for c in failed] == ["NVIDIA driver / NVML", "device nodes", "TensorFlow build", "TensorFlow's GPUs"]
    assert failed[0].fix.startswith("install the NVIDIA driver on the host (nvidia-smi must work), or start the "
                                    "container with GPUs (--gpus all)")
    assert "pip uninstall tensorflow-cpu" in failed[2].fix


def test_every_layer_failing_reads_in_dependency_order(tf_dirs) -> None:
    """One machine broken at every layer the fakes can break at once: WSL1, no driver, no device nodes,
    a CUDA build missing a pip CUDA package, CUDA_VISIBLE_DEVICES hiding all, TensorFlow listing none.
    The failures come bottom-up, each before what depends on it."""
    missing_cudnn = dict(PIP, cuda_packages={**PIP_CUDA, "nvidia-cudnn-cu12": None})
    machine = make_machine(tf_dirs, kernel_version=WSL1, environ=env(CUDA_VISIBLE_DEVICES=""), **NO_GPU_HERE,
                           **missing_cudnn)
    failed = [c.name for c in doctor.run_checks(machine) if c.verdict == FAIL]
    assert failed == ["platform", "NVIDIA driver / NVML", "device nodes", PIP_NAME, "CUDA_VISIBLE_DEVICES",
                      "TensorFlow's GPUs"]


def test_wsl2_gpu_counts_as_a_device_node(tf_dirs) -> None:
    """Under WSL2 the GPU arrives as /dev/dxg, not /dev/nvidiaN: that is not a missing GPU."""
    checks = {c.name: c for c in doctor.run_checks(make_machine(tf_dirs, device_nodes=("/dev/dxg",)))}
    assert checks["device nodes"].verdict == OK and "WSL2" in checks["device nodes"].detail


@pytest.mark.parametrize("installed", [True, False])
def test_doctor_suggests_nvidia_ml_py_only_when_missing(tf_dirs, installed: bool) -> None:
    """No driver: the fix names the driver; `pip install nvidia-ml-py` only when it is not installed."""
    machine = make_machine(tf_dirs, inventory=NO_DRIVER, device_nodes=(), api=FakeAPI(0), nvml_binding=installed)
    [nvml] = [c for c in doctor.run_checks(machine) if c.name == "NVIDIA driver / NVML"]
    assert ("pip install nvidia-ml-py" in nvml.fix) is not installed


def test_inspect_machine_finds_the_binding_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`nvml_binding` comes from find_spec: pynvml is not imported by the doctor's look."""
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    machine = doctor.inspect_machine({}, NO_DRIVER, Policy(), FakeAPI())
    assert machine.nvml_binding == (importlib.util.find_spec("pynvml") is not None)
    assert "pynvml" not in sys.modules


# ----- the checks' building blocks ------------------------------------------------------------------
@pytest.mark.parametrize("capability, covered", [
    ((8, 0), "sm_80"), ((8, 6), "sm_80"), ((8, 9), "sm_89"), ((9, 0), "compute_90"), ((12, 0), "compute_90"),
    ((7, 5), "sm_70"), ((5, 2), None),
])
def test_a_binary_runs_on_its_major_version_and_ptx_on_anything_newer(capability, covered) -> None:
    """CUDA's rules: an sm_XY binary runs on X.Y and later minors of X; PTX compute_XY on X.Y and newer."""
    archs = doctor.parse_architectures(['sm_60', 'sm_70', 'sm_80', 'sm_89', 'compute_90'])
    assert doctor.covers(archs, capability) == covered


def test_an_arch_specific_binary_runs_only_on_its_own_card() -> None:
    """sm_90a kernels (Hopper-only instructions) run on 9.0 and nowhere else."""
    archs = doctor.parse_architectures(["sm_80", "sm_90a"])
    assert archs == [("sm", 8, 0, ""), ("sm", 9, 0, "a")]
    assert doctor.covers(archs, (9, 0)) == "sm_90a" and doctor.covers(archs, (10, 0)) is None


def test_parse_architectures_skips_what_it_cannot_read() -> None:
    assert doctor.parse_architectures(["sm_120", "compute_100", "sm_35", "gfx90a", 7]) == [
        ("sm", 12, 0, ""), ("compute", 10, 0, ""), ("sm", 3, 5, "")]
    assert doctor.parse_architectures(None) == [] and doctor.parse_architectures("sm_80") == []


def test_compute_capabilities_are_read_through_the_nvml_chokepoint() -> None:
    """Through `Nvml.call` (the fake decides the figures); without NVML, none and no call."""
    gpus = four_gpus()
    gpus[3].compute_capability = (9, 0)
    fake = FakeNvml(gpus)
    nvml = Nvml(module=fake)
    assert doctor.read_compute_capabilities(read_inventory(nvml), nvml) == {0: (8, 0), 1: (8, 0), 2: (8, 0), 3: (9, 0)}
    assert fake.calls.count("nvmlDeviceGetCudaComputeCapability") == 4
    assert doctor.read_compute_capabilities(NO_DRIVER) == {}


def test_a_card_nvml_cannot_tell_is_left_out() -> None:
    """An NVML error on one card (the fake raises Not Supported there) leaves that card out, not the check."""
    gpus = four_gpus()
    gpus[1].fail["nvmlDeviceGetCudaComputeCapability"] = 3
    nvml = Nvml(module=FakeNvml(gpus))
    assert sorted(doctor.read_compute_capabilities(read_inventory(nvml), nvml)) == [0, 2, 3]


def test_a_binding_without_the_capability_function_means_unknown(tf_dirs) -> None:
    """An nvidia-ml-py older than `nvmlDeviceGetCudaComputeCapability`: no capabilities, no
    architecture check, and the rest of the report as on a healthy machine (no AttributeError)."""
    nvml = Nvml(module=OlderBinding(FakeNvml(four_gpus()), {"nvmlDeviceGetCudaComputeCapability"}))
    inventory = read_inventory(nvml)
    capabilities = doctor.read_compute_capabilities(inventory, nvml)
    assert capabilities == {} and len(inventory.gpus) == 4
    checks = doctor.run_checks(make_machine(tf_dirs, "archs", inventory=inventory, compute_capabilities=capabilities))
    assert "GPU architecture" not in [c.name for c in checks]
    assert [c.verdict for c in checks if c.name == "NVIDIA driver / NVML"] == [OK]


@pytest.mark.kernel
def test_doctor_in_the_fake_gpu_kernel() -> None:
    """`%tfgpu doctor` in tests/fake_gpu_kernel.py (the four fake cards at the NVML chokepoint) reports
    instead of raising; the driver line is the fake's."""
    from fake_gpu_kernel import KERNEL_NAME, write_kernelspec
    from servers import isolated_jupyter, standalone_kernel

    with isolated_jupyter("tfgpu-doctor-") as env:
        write_kernelspec(env.kernels_dir)
        with standalone_kernel(env, kernel_name=KERNEL_NAME) as kernel:
            kernel.ok("%load_ext tfgpu_magic")
            cell = kernel.ok("%tfgpu doctor")
    checks, _ = parse_report(cell.results[0])
    assert [check for check in checks if check[1] == "NVIDIA driver / NVML"] == [(OK, "NVIDIA driver / NVML", HEALTHY[
        "NVIDIA driver / NVML"][1], "")]


def test_inspect_machine_reads_capabilities_from_the_given_nvml() -> None:
    nvml = Nvml(module=FakeNvml([RTX_5090, *four_gpus()[1:]]))
    machine = doctor.inspect_machine({}, read_inventory(nvml), Policy(), FakeAPI(), nvml)
    assert machine.compute_capabilities[0] == (12, 0) and machine.platform == sys.platform


def test_cuda_packages_come_from_the_installed_metadata() -> None:
    """The installed TensorFlow's own `and-cuda` extra names the packages (no list kept here)."""
    distribution = doctor._tf_distribution()
    if distribution is None:
        pytest.skip("TensorFlow is not installed")
    packages = doctor.cuda_packages(distribution.split()[0])
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"} <= set(packages)
    assert all(name.startswith("nvidia-") for name in packages)
    assert doctor.cuda_packages("no-such-distribution-anywhere") == {}


def write_distribution(site: Path, name: str, version: str, *requires: str) -> None:
    """An installed distribution as importlib.metadata finds it on sys.path: a `.dist-info` folder."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_cuda_packages_are_the_nvidia_requirements_of_the_extra_with_installed_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TensorFlow-like distribution whose `and-cuda` extra requires two nvidia packages (one
    installed, one not) and a non-nvidia one; other extras and plain requirements do not count."""
    write_distribution(tmp_path, "tfgpu-test-tensorflow", "2.99.0", "numpy>=1.26",
                       'nvidia-tfgpu-test-cublas-cu12==12.5.3.2; extra == "and-cuda"',
                       "nvidia-tfgpu-test-missing-cu12 (>=9.3); extra=='and-cuda'",
                       'tensorrt==10.0; extra == "and-cuda"',
                       'nvidia-tfgpu-test-nccl-cu12==2.21.5; extra == "other"')
    write_distribution(tmp_path, "nvidia-tfgpu-test-cublas-cu12", "12.5.3.2")
    write_distribution(tmp_path, "nvidia-tfgpu-test-nccl-cu12", "2.21.5")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doctor.cuda_packages("tfgpu-test-tensorflow") == {
        "nvidia-tfgpu-test-cublas-cu12": "12.5.3.2", "nvidia-tfgpu-test-missing-cu12": None}


def test_the_loader_path_is_the_one_the_process_started_with(tmp_path: Path) -> None:
    """A fresh interpreter started with LD_LIBRARY_PATH=/from/start that then changes os.environ:
    the doctor reads the start value (what the loader uses); unset at start reads as ''."""
    probe = ("import os; from tfgpu_magic import doctor; os.environ['LD_LIBRARY_PATH'] = '/set/later'; "
             "print(repr(doctor._startup_variable('LD_LIBRARY_PATH')))")
    run = lambda extra: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,  # noqa: E731
                                       env={k: v for k, v in {**dict(os.environ), **extra}.items() if v is not None})
    assert run({"LD_LIBRARY_PATH": "/from/start"}).stdout.strip() == "'/from/start'"
    assert run({"LD_LIBRARY_PATH": None}).stdout.strip() == "''"


def test_loaded_cuda_libraries_from_a_maps_text() -> None:
    """/proc/PID/maps lines: CUDA libraries (pip's or the system's) once each; the driver's and others not."""
    maps = "\n".join([
        f"7f00-7f10 r--p 00000000 08:01 1 {SITE}/nvidia/cudnn/lib/libcudnn.so.9",
        f"7f10-7f20 r-xp 00010000 08:01 1 {SITE}/nvidia/cudnn/lib/libcudnn.so.9",
        "7f20-7f30 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libcublas.so.12.5.3",
        "7f30-7f40 r--p 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "7f40-7f50 r--p 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "7f50-7f60 rw-p 00000000 00:00 0",
        "7ffd-7ffe rw-p 00000000 00:00 0 [stack]",
    ])
    assert doctor.loaded_cuda_libraries(maps) == (f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9",
                                                  "/usr/lib/x86_64-linux-gnu/libcublas.so.12.5.3")
    assert doctor.loaded_cuda_libraries(Path("/proc/self/maps").read_text()) == ()  # none in this process


# ----- --json -------------------------------------------------------------------------------------
def test_report_json_is_the_checks_as_data(tf_dirs) -> None:
    checks = doctor.run_checks(make_machine(tf_dirs, **PIP))
    data = json.loads(doctor_view.report_json(checks))
    assert data == [{"check": c.name, "verdict": c.verdict, "detail": c.detail, "fix": c.fix} for c in checks]
    assert [(d["check"], d["verdict"]) for d in data if d["check"] == PIP_NAME] == [(PIP_NAME, WARN)]


@THIS_MACHINE
@pytest.mark.usefixtures("python_on_path")
def test_magic_doctor_json(shell: InteractiveShell, magic: Controller, capsys: pytest.CaptureFixture) -> None:
    """`%tfgpu doctor --json` on the real shell prints one JSON list: the same checks as the text;
    `--json` belongs to doctor only."""
    capsys.readouterr()
    shell.run_line_magic("tfgpu", "doctor --json")
    data = json.loads(capsys.readouterr().out)
    checks, _ = parse_report(str(actions.doctor(magic)))
    assert [(d["verdict"], d["check"], d["detail"], d["fix"]) for d in data] == checks
    assert actions.doctor(magic, json=True) == json.dumps(data, indent=2, ensure_ascii=False)
    with pytest.raises(UsageError, match="--json"):
        shell.run_line_magic("tfgpu", "status --json")


# ----- the other frameworks' builds, read without importing them --------------------------------------------
TORCH_VERSION_PY = ("from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
                    "__version__ = '2.14.1+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
                    "git_version = '5c4886908584029761b579af026dcfb627c84070'\nhip: Optional[str] = None\n")
"""torch/version.py as PyPI's CUDA wheel of torch 2.14.1 has it (its distribution's version is plain 2.14.1)."""


def write_torch(root: Path, version_py: str | None) -> Path:
    """A `torch` package on `root` whose version.py holds `version_py` (None: none), and whose
    `__init__` would leave a marker if it ever ran."""
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(root / 'imported')!r}, 'w').close()\n", encoding="utf-8")
    if version_py is not None:
        (package / "version.py").write_text(version_py, encoding="utf-8")
    return package


@pytest.mark.parametrize("version_py, build", [
    (TORCH_VERSION_PY, {"__version__": "2.14.1+cu130", "cuda": "13.0", "hip": None}),
    ("__version__ = '2.13.0+cpu'\ncuda = None\nhip = None\n", {"__version__": "2.13.0+cpu", "cuda": None, "hip": None}),
    ("import os\n__version__ = os.environ['X']\n", {}),
    ("cuda = (\n", {}),
    (None, {}),
], ids=["cuda-wheel", "cpu-wheel", "not-a-literal", "syntax", "no-version-py"])
def test_torch_build_is_read_from_version_py_without_importing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version_py: str | None, build: dict) -> None:
    """torch not imported: its version.py parsed, never executed (nor torch's `__init__`); unreadable: {}."""
    write_torch(tmp_path, version_py)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert doctor.read_torch_build() == build
    assert "torch" not in sys.modules and not (tmp_path / "imported").exists()


def test_torch_build_of_an_imported_torch_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel imported torch, `torch.version` answers (nothing is read from disk)."""
    version = types.SimpleNamespace(__version__="2.13.0+cu128", cuda="12.8", hip=None, debug=False)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(version=version))
    assert doctor.read_torch_build() == {"__version__": "2.13.0+cu128", "cuda": "12.8", "hip": None}


def test_no_torch_no_line(monkeypatch: pytest.MonkeyPatch, tf_dirs) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name == "torch" else find_spec(name, package))
    assert doctor.read_torch_build() is None
    assert "PyTorch build" not in [c.name for c in doctor.run_checks(make_machine(tf_dirs, torch_build=None))]


def test_jax_distributions_are_its_plugins_from_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jax, jaxlib and each CUDA plugin and PJRT runtime (names as pip normalizes them), the first
    on sys.path winning; other jax-* distributions are not among them; no jax: {}."""
    for name, version in [("jax", "0.8.1"), ("jaxlib", "0.8.1"), ("jax_cuda12_plugin", "0.7.2"),
                          ("jax-cuda12-pjrt", "0.7.2"), ("jax-cuda12-plugin-extras", "1.0"), ("jaxtyping", "0.3")]:
        write_distribution(tmp_path, name, version)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doctor.jax_distributions() == {"jax": "0.8.1", "jaxlib": "0.8.1", "jax-cuda12-plugin": "0.7.2",
                                          "jax-cuda12-pjrt": "0.7.2"}
    monkeypatch.setattr(doctor, "_version", lambda package: None)
    assert doctor.jax_distributions() == {}


def test_inspect_machine_imports_neither_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor's look at this machine leaves torch and jax unimported (TensorFlow too)."""
    for name in ("torch", "jax", "jaxlib"):
        if name not in sys.modules:
            monkeypatch.delitem(sys.modules, name, raising=False)
    had = {name for name in ("torch", "jax", "jaxlib") if name in sys.modules}
    machine = doctor.inspect_machine({}, NO_DRIVER, Policy(), FakeAPI())
    assert {name for name in ("torch", "jax", "jaxlib") if name in sys.modules} == had
    assert (machine.torch_build is None) == (importlib.util.find_spec("torch") is None)
    assert bool(machine.jax_packages) == (importlib.util.find_spec("jax") is not None)

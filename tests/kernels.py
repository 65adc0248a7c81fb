"""Real ipykernel kernels for tests, isolated from the machine's Jupyter setup.

A kernelspec written into a temporary directory points at `sys.executable` (the venv's Python,
whatever kernelspecs the machine has); the kernel gets its own JUPYTER_RUNTIME_DIR, IPYTHONDIR and
JUPYTER_DATA_DIR. `running_kernel()` always shuts the kernel down; `Kernel.run()` executes a cell
and collects what a notebook would show. TensorFlow is imported only inside those kernels.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from jupyter_client import AsyncKernelManager, BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from tfgpu_magic.envvars import NAMES as OUR_ENV

KERNEL_NAME = "tfgpu-test-python"
STARTUP_TIMEOUT = 60
CELL_TIMEOUT = 90
HEAVY_MODULES = ("tensorflow", "keras", "jax", "torch", "ipywidgets", "pynvml")
"""Modules `%load_ext tfgpu_magic` must not import."""

QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",  # TensorFlow's C++ logging, read at import
    "TF_ENABLE_ONEDNN_OPTS": "0",  # drops the oneDNN banner printed even at log level 3
}
"""Environment for every kernel and subprocess running TensorFlow."""


def quiet_env(**extra: str) -> dict[str, str]:
    """`os.environ` without the variables tfgpu_magic manages or reads (the tester's CUDA_VISIBLE_DEVICES
    or TFGPU_MAGIC_POLICY must not leak in), plus `QUIET_ENV` and `extra`: the environment of a
    TensorFlow subprocess or kernel."""
    inherited = {
        name: value for name, value in os.environ.items() if name not in OUR_ENV and not name.startswith("TFGPU_MAGIC_")
    }
    return {**inherited, **QUIET_ENV, **extra}


def isolated_env(root: Path) -> dict[str, str]:
    """Jupyter/IPython directories under `root`, so nothing of the machine's setup leaks in."""
    dirs = {
        "JUPYTER_RUNTIME_DIR": root / "runtime",
        "IPYTHONDIR": root / "ipython",
        "JUPYTER_DATA_DIR": root / "data",
        "JUPYTER_CONFIG_DIR": root / "config",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {name: str(path) for name, path in dirs.items()}


def kernel_manager(root: Path, *, asynchronous: bool = False, ipython_config: str = "") -> KernelManager:
    """A manager for a kernel running `sys.executable`, its spec and files under `root`.

    `asynchronous=True` gives the `AsyncKernelManager` that nbclient needs; `ipython_config` is the
    text of the kernel's `ipython_kernel_config.py` (in the isolated IPYTHONDIR).
    """
    env = {**QUIET_ENV, **isolated_env(root)}
    profile = Path(env["IPYTHONDIR"]) / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text(ipython_config)
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tfgpu_magic tests",
        "language": "python",
        "env": env,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    manager_class = AsyncKernelManager if asynchronous else KernelManager
    return manager_class(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(root / "kernels")]),
        connection_file=str(Path(env["JUPYTER_RUNTIME_DIR"]) / "kernel-test.json"),
        transport="ipc",  # local sockets: no TCP ports, no 'running over TCP without encryption' warning
        ip=str(root / "ipc"),
    )


@dataclass
class CellResult:
    """What one executed cell produced."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    results: list[str] = field(default_factory=list)
    """`text/plain` of execute results and displays."""
    html: list[str] = field(default_factory=list)
    """`text/html` of execute results and displays that have one."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """IOPub `error` messages: ename, evalue, traceback."""

    @property
    def traceback(self) -> str:
        return "\n".join(line for error in self.errors for line in error["traceback"])

    @property
    def output(self) -> str:
        """Everything a notebook would show for the cell, as text."""
        return "\n".join([self.stdout, self.stderr, *self.results, self.traceback])

    def collect(self, msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            setattr(self, content["name"], getattr(self, content["name"]) + content["text"])
        elif kind in ("execute_result", "display_data"):
            self.results.append(content["data"].get("text/plain", ""))
            if "text/html" in content["data"]:
                self.html.append(content["data"]["text/html"])
        elif kind == "error":
            self.errors.append(content)


class Kernel:
    """A started kernel and its blocking client."""

    def __init__(self, manager: KernelManager, client: BlockingKernelClient) -> None:
        self.manager = manager
        self.client = client

    def run(self, code: str, timeout: float = CELL_TIMEOUT) -> CellResult:
        """Execute `code` as a notebook cell; stdout, stderr, results and errors collected."""
        result = CellResult()
        reply = self.client.execute_interactive(
            code, timeout=timeout, output_hook=result.collect, allow_stdin=False, stop_on_error=False
        )
        result.status = reply["content"]["status"]
        return result

    def ok(self, code: str, timeout: float = CELL_TIMEOUT) -> CellResult:
        """`run`, asserting the cell raised nothing."""
        result = self.run(code, timeout)
        assert result.status == "ok" and not result.errors, result.output
        return result

    def evaluate(self, expression: str, timeout: float = CELL_TIMEOUT) -> Any:
        """The value of a Python literal `expression` in the kernel (through `user_expressions`)."""
        reply = self.client.execute_interactive(
            "", silent=True, user_expressions={"value": expression}, timeout=timeout, output_hook=lambda msg: None
        )
        value = reply["content"]["user_expressions"]["value"]
        assert value["status"] == "ok", f"{expression}: {value.get('ename')}: {value.get('evalue')}"
        return ast.literal_eval(value["data"]["text/plain"])

    def loaded_modules(self, *names: str) -> set[str]:
        """Which of `names` are in the kernel's `sys.modules`."""
        return set(self.evaluate(f"[m for m in {list(names)!r} if m in __import__('sys').modules]"))


@contextlib.contextmanager
def running_kernel(startup_timeout: float = STARTUP_TIMEOUT, ipython_config: str = "") -> Iterator[Kernel]:
    """Start an isolated kernel, yield it, and always shut it down and remove its files."""
    with tempfile.TemporaryDirectory(prefix="tfgpu-kernel-") as tmp:
        manager = kernel_manager(Path(tmp), ipython_config=ipython_config)
        client = None
        try:
            manager.start_kernel(cwd=tmp, env=quiet_env())
            client = manager.client()
            client.start_channels()
            client.wait_for_ready(timeout=startup_timeout)
            yield Kernel(manager, client)
        finally:
            if client is not None:
                client.stop_channels()
            if manager.has_kernel:
                manager.shutdown_kernel(now=True)  # also removes the connection file
            else:
                manager.cleanup_resources()


@pytest.fixture(autouse=True)
def tensorflow_stays_out_of_pytest() -> Iterator[None]:
    """Autouse where imported: TensorFlow runs only in kernels and subprocesses, never in pytest,
    where its initialized runtime would lock device settings for the whole session."""
    yield
    assert "tensorflow" not in sys.modules, "a test imported TensorFlow into the pytest process"

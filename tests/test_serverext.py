"""The server extension (`tfgpu_magic.serverext`) and the state kernels publish for it (`jupyter.kernelstate`).

The handlers run in a real jupyter_server inside this process (pytest-jupyter's `jp_serverapp`, driven
with `jp_fetch`), with the extension enabled as the installed `jupyter-config` file enables it and NVML
the four-card fake at its chokepoint (`inventory.shared_nvml`); real ipykernels are started through the
server's own sessions API, and their real pids placed on the fake cards. The kernel side is tested on a
controller over `FakeTF` (TensorFlow's rules, imported and initialized at will), and on a real kernel
that publishes while the server reads.

pytest-jupyter's fixtures are imported by name for this module only: registered as a plugin, its autouse
fixtures would start and clean up a server around every test of the suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from pytest_jupyter.jupyter_core import (  # noqa: F401 (fixtures)
    echo_kernel_spec, jp_asyncio_loop, jp_config_dir, jp_data_dir, jp_env_config_path, jp_env_jupyter_path,
    jp_environ, jp_home_dir, jp_kernel_dir, jp_runtime_dir, jp_system_config_path, jp_system_jupyter_path,
)
from pytest_jupyter.jupyter_server import (  # noqa: F401 (fixtures)
    jp_argv, jp_auth_header, jp_base_url, jp_configurable_serverapp, jp_fetch, jp_http_port, jp_logging_stream,
    jp_nbconvert_templates, jp_root_dir, jp_server_cleanup, jp_serverapp, jp_web_app,
)
from pytest_jupyter.pytest_tornasync import http_server, http_server_client, http_server_port, io_loop  # noqa: F401
from servers import JupyterEnv, await_new_kernel, dead_pid, wait_until
from tornado.httpclient import HTTPClientError

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus import inventory, processes
from tfgpu_magic.gpus.inventory import MIB, Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.jupyter import kernelstate, persist
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.serverext import gather

ROOT = Path(__file__).resolve().parents[1]
EXTENSION_CONFIG = ROOT / "jupyter-config" / "jupyter_server_config.d" / "tfgpu_magic.json"
XSS_NOTEBOOK = "<img src=x onerror=alert(1)>.ipynb"
GIB = 1024 * MIB


def conforms(document: Any, name: str) -> Any:
    """`document`, after checking it against `$defs/<name>` of the package's schema (jsonschema raises)."""
    from jsonschema import Draft202012Validator

    schema = json.loads(kernelstate.SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"}).validate(document)
    return document


# ----- the server, its fake cards, its kernels ---------------------------------------------------------
FAKE_GPU_SERVER_CONFIG = """# Written by tests/test_serverext.py: this server's NVML is the four fake cards
# (tests/fake_nvml.py), with the processes {placement} names placed on them ({{"pid": [gpu, mib]}}, read at
# every inventory read).
import json, sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus import inventory

PLACEMENT = Path({placement!r})


class PlacedNvml(FakeNvml):
    def nvmlDeviceGetCount(self):
        try:
            placed = json.loads(PLACEMENT.read_text())
        except (OSError, ValueError):
            placed = {{}}
        for index, (gpu, (processes, used)) in enumerate(zip(self.gpus, BASE)):
            here = [(int(pid), mib) for pid, (where, mib) in placed.items() if where == index]
            gpu.processes = processes + here
            gpu.used_mib = used + sum(mib for _, mib in here)  # the card counts what its processes hold
        return super().nvmlDeviceGetCount()


GPUS = four_gpus(this_kernel=False)
BASE = [(list(gpu.processes), gpu.used_mib) for gpu in GPUS]
NVML = inventory.Nvml(module=PlacedNvml(GPUS))
inventory.shared_nvml = lambda: NVML
c.ServerApp.jpserver_extensions.update({{"tfgpu_magic.serverext": True}})
"""


def write_fake_gpu_server_config(config_dir: Path, placement: Path) -> None:
    """Make the Jupyter server that reads `config_dir` (its JUPYTER_CONFIG_DIR) see the four fake cards,
    with the pids `placement` names on them, and load the extension. For servers in their own process
    (the browser tests, the benchmark), where `fake_nvml` below cannot reach."""
    text = FAKE_GPU_SERVER_CONFIG.format(tests=str(Path(__file__).resolve().parent), placement=str(placement))
    (config_dir / "jupyter_server_config.py").write_text(text, encoding="utf-8")


def place(placement: Path, pids: dict[int, tuple[int, int]]) -> None:
    """Put each pid on a fake card: pid → (GPU index, MiB), as `write_fake_gpu_server_config` reads it."""
    written = placement.with_suffix(".new")
    written.write_text(json.dumps({str(pid): list(where) for pid, where in pids.items()}), encoding="utf-8")
    written.replace(placement)  # a read sees the old placement or the new one


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    """The installed enabling file, and no reuse of a reading (each request reads the fake anew)."""
    config = json.loads(EXTENSION_CONFIG.read_text(encoding="utf-8"))
    return {**config, "TFGPUServer": {"cache_seconds": 0}}


class RecordingNvml(FakeNvml):
    """The fake, also recording the thread of every device count (one per inventory read)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[str] = []

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (pynvml's name)
        self.threads.append(threading.current_thread().name)
        return super().nvmlDeviceGetCount()


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> RecordingNvml:
    """Four fake cards at the chokepoint the server reads (GPU 0: this pytest process and a dead pid)."""
    gpus = four_gpus()
    gpus[0].processes[1] = (dead_pid(), 19456)  # another process: no /proc entry, no name
    fake = RecordingNvml(gpus)
    nvml = Nvml(module=fake)
    monkeypatch.setattr(inventory, "shared_nvml", lambda: nvml)
    return fake


class Api:
    """`jp_fetch` run to completion on the test's loop; JSON in, JSON out."""

    def __init__(self, fetch: Callable[..., Any], loop: asyncio.AbstractEventLoop) -> None:
        self.fetch = fetch
        self.loop = loop

    def call(self, method: str, *parts: str, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        data = json.dumps(body) if body is not None else ("{}" if method == "POST" else None)
        reply = self.loop.run_until_complete(self.fetch(*parts, method=method, body=data, **kwargs))
        self.last = reply
        return json.loads(reply.body) if reply.body else None

    def gpus(self) -> dict[str, Any]:
        return conforms(self.call("GET", "api", "tfgpu", "gpus"), "gpusReply")

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        return conforms(self.call("GET", "api", "tfgpu", "kernels", kernel_id), "kernelReply")

    def keep(self, kernel_id: str) -> dict[str, Any]:
        return conforms(self.call("POST", "api", "tfgpu", "kernels", kernel_id, "keep"), "keepReply")

    def refused(self, status: int, method: str, *parts: str, **kwargs: Any) -> dict[str, Any]:
        """The body of a reply that is `status`, checked against `$defs/error` (every refusal is one)."""
        with pytest.raises(HTTPClientError) as refused:
            self.call(method, *parts, **kwargs)
        assert refused.value.code == status
        return conforms(json.loads(refused.value.response.body), "error")

    def pause(self, seconds: float) -> None:
        """Let the server's loop run (it hears kernels' status messages only while it runs)."""
        self.loop.run_until_complete(asyncio.sleep(seconds))


@pytest.fixture
def api(jp_fetch: Callable[..., Any], jp_asyncio_loop: asyncio.AbstractEventLoop) -> Api:
    # pytest-jupyter may hand back a loop it made earlier without making it current again, and an earlier
    # `asyncio.run` in this process leaves no current loop: tornado's client needs one to make its futures.
    asyncio.set_event_loop(jp_asyncio_loop)
    return Api(jp_fetch, jp_asyncio_loop)


class NotebookKernel:
    """A notebook's session on the test server: its real kernel, a client on it, its pid."""

    def __init__(self, api: Api, serverapp: Any, path: str) -> None:
        (Path(serverapp.root_dir) / path).parent.mkdir(parents=True, exist_ok=True)
        session = api.call("POST", "api", "sessions",
                           body={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
        self.session_id, self.kernel_id = session["id"], session["kernel"]["id"]
        self.pid: int = serverapp.kernel_manager.get_kernel(self.kernel_id).provisioner.pid
        env = JupyterEnv(Path(serverapp.root_dir))
        self.kernel = env.connect(Path(serverapp.runtime_dir) / f"kernel-{self.kernel_id}.json")

    def publish(self, *directives: str) -> None:
        """Start publishing in the kernel (as loading the extension will), then edit its policy."""
        lines = ["import tfgpu_magic", "tfgpu_magic.get_controller()  # hooks up the views' words: publishing starts",
                 "%load_ext tfgpu_magic", *[f"%tfgpu {line}" for line in directives]]
        self.kernel.ok("\n".join(lines))


def test_gpus_name_this_servers_kernels_notebooks_and_only_user_and_memory_of_others(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    notebook = NotebookKernel(api, jp_serverapp, f"sub/{XSS_NOTEBOOK}")
    try:
        notebook.publish("growth on")
        fake_nvml.gpus[1].processes = [(notebook.pid, 2048)]
        reply = api.gpus()
    finally:
        notebook.kernel.close()
    assert reply["gpu_status"] == {"error": None, "stale_seconds": None, "host_pids": False}
    assert [gpu["index"] for gpu in reply["gpus"]] == [0, 1, 2, 3] and all(gpu["granted"] for gpu in reply["gpus"])
    gpu0, gpu1 = reply["gpus"][0], reply["gpus"][1]
    assert (gpu0["memory_used"], gpu0["memory_total"], gpu0["utilization"]) == (20480 * MIB, 80 * GIB, 50)
    assert reply["gpus"][3]["mig"] and reply["gpus"][3]["memory_total"] == 40 * GIB
    (row,) = gpu1["processes"]
    assert row["pid"] == notebook.pid and row["mine"] and row["gpu_memory"] == 2 * GIB and row["user"]
    assert row["memory_source"] == "nvml"
    kernel = row["kernel"]
    assert (kernel["kernel_id"], kernel["notebook"], kernel["tensorflow"]) == (
        notebook.kernel_id, f"sub/{XSS_NOTEBOOK}", "not_imported")
    assert kernel["execution_state"] in ("idle", "busy")
    me, other = gpu0["processes"]
    assert me["pid"] == os.getpid() and me["mine"] and me["kernel"] is None
    assert (other["user"], other["mine"], other["kernel"], other["gpu_memory"]) == (None, False, None, 19456 * MIB)


def test_a_busy_kernel_still_answers_with_its_policy_tensorflow_state_and_memory(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    notebook = NotebookKernel(api, jp_serverapp, "a.ipynb")
    state_file = kernelstate.state_path(notebook.kernel_id, Path(jp_serverapp.runtime_dir))
    try:
        notebook.publish("visible 1", "growth on")
        fake_nvml.gpus[1].processes = [(notebook.pid, 3 * 1024)]
        notebook.kernel.client.execute("import time; time.sleep(30)")

        def busy() -> dict[str, Any] | None:
            api.pause(0.2)
            reply = api.kernel(notebook.kernel_id)
            held = reply["gpus"] and reply["gpus"][0]["kernel_memory"] == 3 * GIB  # the reading after the placement
            return reply if reply["kernel"]["execution_state"] == "busy" and held else None

        reply = wait_until(busy, 30, "the server seeing the kernel busy")
        assert reply["published"] and reply["policy"]["visible"] == ["1"] and reply["policy"]["growth"] is True
        assert reply["tensorflow"]["state"] == "not_imported" and reply["error"] is None
        assert reply["gpus_from"] == "policy"
        assert reply["gpus"] == [{"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GIB,
                                  "kernel_memory": 3 * GIB, "memory_source": "nvml"}]
        assert (reply["kernel"]["notebook"], reply["pid"], reply["kernel"]["idle_seconds"]) == ("a.ipynb", notebook.pid, None)
        assert not reply["restart_needed"] and reply["pending"] == [] and reply["keep"]
        api.call("POST", "api", "kernels", notebook.kernel_id, "interrupt")
        assert state_file.exists() and stat.S_IMODE(state_file.stat().st_mode) == 0o600
    finally:
        notebook.kernel.close()
    api.call("DELETE", "api", "sessions", notebook.session_id)
    wait_until(lambda: not state_file.exists(), 30, "the kernel removing its state file as it exits")


def test_loading_the_extension_publishes_and_a_policy_edit_republishes(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """What a user does, nothing more: `%load_ext` and `%tfgpu` (the controller starts publishing)."""
    notebook = NotebookKernel(api, jp_serverapp, "plain.ipynb")
    try:
        notebook.kernel.ok("%load_ext tfgpu_magic\nimport tfgpu_magic\ntfgpu_magic.current_policy()")
        first = api.kernel(notebook.kernel_id)
        notebook.kernel.ok("%tfgpu growth on")
        second = api.kernel(notebook.kernel_id)
    finally:
        notebook.kernel.close()
    assert first["published"] and first["policy"] == kernelstate.policy_record(Policy())
    assert first["tensorflow"]["state"] == "not_imported"
    assert second["policy"]["growth"] is True and second["gpus_from"] == "all" and len(second["gpus"]) == 4


def test_keep_stores_the_published_policy_for_the_next_kernel_which_has_it_in_force(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """The labextension's restart: the server keeps what the kernel published (asking the kernel
    nothing), the server restarts the kernel, and the new kernel starts with the policy."""
    notebook = NotebookKernel(api, jp_serverapp, "kept.ipynb")
    runtime = Path(jp_serverapp.runtime_dir)
    try:
        notebook.publish("growth on", "limit 2GB", "allocator async")
        wanted = notebook.kernel.evaluate("__import__('tfgpu_magic').current_policy().to_dict()")
        assert api.keep(notebook.kernel_id) == {**gather.KEEP_STAMP, "kept": True}
        assert persist.pending_path(notebook.kernel_id, runtime).is_file()
        api.call("POST", "api", "kernels", notebook.kernel_id, "restart")
        kernel = await_new_kernel(notebook.kernel, notebook.pid)
        try:
            assert kernel.evaluate("__import__('tfgpu_magic').current_policy().to_dict()") == wanted
        finally:
            kernel.close()
    finally:
        notebook.kernel.close()
    assert not persist.pending_path(notebook.kernel_id, runtime).exists()  # taken by the new kernel


def test_keep_without_tfgpu_magic_in_the_kernel_keeps_nothing(api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    notebook = NotebookKernel(api, jp_serverapp, "plain-keep.ipynb")
    try:
        assert api.keep(notebook.kernel_id) == {**gather.KEEP_STAMP, "kept": False}
        assert not persist.pending_path(notebook.kernel_id, Path(jp_serverapp.runtime_dir)).exists()
    finally:
        notebook.kernel.close()
    with pytest.raises(HTTPClientError) as refused:
        api.call("POST", "api", "tfgpu", "kernels", notebook.kernel_id, "keep", headers={"Authorization": ""})
    assert refused.value.code == 403
    missing = api.refused(404, "POST", "api", "tfgpu", "kernels", "0a1b2c3d-0000-4000-8000-000000000000", "keep")
    assert missing["code"] == "unknown_kernel"


def test_without_auth_both_endpoints_answer_403_and_an_unknown_kernel_404(api: Api, fake_nvml: RecordingNvml) -> None:
    """Each refusal's body is `$defs/error`, with the code of what refused it."""
    for parts in (("api", "tfgpu", "gpus"), ("api", "tfgpu", "kernels", "0a1b2c3d-0000-4000-8000-000000000000")):
        assert api.refused(403, "GET", *parts, headers={"Authorization": ""})["code"] == "forbidden"
    missing = api.refused(404, "GET", "api", "tfgpu", "kernels", "0a1b2c3d-0000-4000-8000-000000000000")
    assert missing["code"] == "unknown_kernel" and "0a1b2c3d" in missing["message"]
    assert fake_nvml.threads == []  # refused before anything was read


def test_a_client_of_another_schema_version_gets_409_naming_both_and_a_bad_since_400(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """The browser sends its version (`x-version-header`); the server answers another with both versions, so
    the browser says which side is older. A client that sends none, or the same, is answered."""
    header = kernelstate.contract()["x-version-header"]
    ours = kernelstate.schema_version()
    for given, client in ((str(ours - 1), ours - 1), (str(ours + 1), ours + 1), ("two", None)):
        body = api.refused(409, "GET", "api", "tfgpu", "gpus", headers={header: given})
        assert body == {"code": "version_mismatch", "message": body["message"], "server_version": ours,
                        "client_version": client}
    answered = api.call("GET", "api", "tfgpu", "gpus", headers={header: str(ours)})
    assert {key: answered[key] for key in ("format", "version")} == gather.GPUS_STAMP == {
        "format": kernelstate.format_of("gpusReply"), "version": ours}
    notebook = NotebookKernel(api, jp_serverapp, "since.ipynb")
    try:
        body = api.refused(400, "GET", "api", "tfgpu", "kernels", notebook.kernel_id, params={"since": "nan"})
        assert body["code"] == "bad_since"
        assert api.refused(409, "POST", "api", "tfgpu", "kernels", notebook.kernel_id, "keep",
                           headers={header: "1"})["code"] == "version_mismatch"
    finally:
        notebook.kernel.close()


def test_reads_run_off_the_event_loop_and_one_reading_serves_the_cache_period(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    readings = jp_serverapp.web_app.settings["tfgpu_readings"]
    readings.nvml.max_age = 60
    for _ in range(3):
        api.gpus()
    assert len(fake_nvml.threads) == 1 and threading.current_thread().name not in fake_nvml.threads
    readings.nvml.max_age = 0
    api.gpus()
    assert len(fake_nvml.threads) == 2
    assert api.last.headers["Server-Timing"].startswith("tfgpu;dur=")


def test_without_nvml_the_cards_are_empty_with_the_reason(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = Nvml(module=FakeNvml([], init_error=9))
    monkeypatch.setattr(inventory, "shared_nvml", lambda: nvml)
    reply = api.gpus()
    error = reply["gpu_status"]["error"]
    assert reply["gpus"] == [] and error["code"] == "nvml_failed"
    assert "NVML could not start: Driver Not Loaded" in error["message"]


def test_the_reasons_for_no_cards_are_codes_set_where_they_happen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The browser words a code; the English stays in `message`. The code comes from `gpus.inventory`,
    where NVML failed: a message reworded there changes no code (none is found by comparing words)."""
    monkeypatch.setattr(inventory, "driver_present", lambda: False)
    monkeypatch.setattr(inventory, "NO_DRIVER", "reworded")
    assert gather.nvml_error(read_inventory(Nvml())) == {"code": "no_driver", "message": "reworded"}
    monkeypatch.setattr(inventory, "driver_present", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it raises ImportError
    assert gather.nvml_error(read_inventory(Nvml()))["code"] == "nvml_missing"
    assert gather.nvml_error(read_inventory(Nvml(module=FakeNvml([], init_error=9))))["code"] == "nvml_failed"
    assert gather.nvml_error(Inventory(error="a reading without a code")) == {
        "code": "nvml_failed", "message": "a reading without a code"}
    assert gather.nvml_error(Inventory()) is None and gather.nvml_error(None) is None


# ----- the published state, read as hostile ----------------------------------------------------------
@pytest.fixture
def lookalike_kernel(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A process whose command line is a server kernel's (`ipykernel_launcher -f .../kernel-<id>.json`)."""
    kernel_id = "5e1f0c2a-1111-4222-8333-444455556666"
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "ipykernel_launcher", "-f",
            str(tmp_path / f"kernel-{kernel_id}.json")]
    process = subprocess.Popen(argv)
    try:
        wait_until(lambda: processes.runs_kernel(process.pid, kernel_id), 30, "the lookalike's command line (after exec)")
        yield kernel_id, process.pid
    finally:
        process.kill()
        process.wait(10)


def valid_state(kernel_id: str, pid: int, policy: Policy = Policy(growth=True)) -> dict[str, Any]:
    """A state record as a kernel with `policy` and TensorFlow imported writes it."""
    return {**kernelstate.STAMP, "kernel_id": kernel_id, "pid": pid, "written": 1.5e9,
            "policy": kernelstate.policy_record(policy),
            "tensorflow": {"state": "imported", "cuda_started": False, "initialized_by": None, "memory": []},
            "pending": [], "restart_needed": False, "keep": True,
            "frameworks": {"jax": None, "torch": None, "keras": None}}


def _write_state(path: Path, mode: int = 0o600, text: str | None = None, **record: Any) -> None:
    path.write_text(text if text is not None else json.dumps(record))
    path.chmod(mode)


def _read(kernel_id: str, directory: Path) -> dict[str, Any] | None:
    return kernelstate.read_state(kernel_id, directory, processes.runs_kernel)


HOSTILE_STATES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("pending is 5", lambda good: json.dumps({**good, "pending": 5})),
    ("NaN", lambda good: json.dumps({**good, "written": float("nan")})),
    ("Infinity in a count", lambda good: json.dumps({**good, "policy": {**good["policy"], "cpu_devices": float("inf")}})),
    ("wrong types", lambda good: json.dumps({**good, "restart_needed": "yes", "keep": 1})),
    ("an unknown state", lambda good: json.dumps({**good, "tensorflow": {**good["tensorflow"], "state": "yes"}})),
    ("a pending change without a reason", lambda good: json.dumps({**good, "pending": [
        {"setting": "growth", "device": "GPU:0", "now": None, "wanted": True, "needs_restart": True}]})),
    ("a string of 10 MB", lambda good: json.dumps({**good, "kernel_id": "k" * (10 << 20)})),
    ("not an object", lambda good: "[1, 2, 3]"),
    ("nested 100,000 deep", lambda good: "[" * 100_000),
    ("17 cells", lambda good: json.dumps({**good, "cells": [{"execution_count": 1, "start": 1.0, "end": None}] * 17})),
    ("a figure past 2**53", lambda good: json.dumps({**good, "tensorflow": {**good["tensorflow"], "memory": [
        {"device": "GPU:0", "card": "0", "current": 2 ** 53, "peak": 2 ** 53}]}})),
]


def test_a_published_state_is_trusted_only_from_the_process_running_that_kernel(
        tmp_path: Path, lookalike_kernel: tuple[str, int]) -> None:
    kernel_id, pid = lookalike_kernel
    path = kernelstate.state_path(kernel_id, tmp_path)
    _write_state(path, **valid_state(kernel_id, pid))
    assert _read(kernel_id, tmp_path)["policy"]["growth"] is True
    for pid_seen in (dead_pid(), os.getpid()):  # a kernel that died without removing it; another process
        _write_state(path, **valid_state(kernel_id, pid_seen))
        assert _read(kernel_id, tmp_path) is None, pid_seen
    path.unlink()
    assert _read(kernel_id, tmp_path) is None  # nothing published
    refused = [(0o622, valid_state(kernel_id, pid)), (0o600, valid_state("another", pid)),
               (0o600, {**valid_state(kernel_id, pid), "format": "x"})]
    for mode, record in refused:
        _write_state(path, mode, **record)
        with pytest.raises(kernelstate.StateInvalid):
            _read(kernel_id, tmp_path)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(kernelstate.StateInvalid, match="not a regular file"):
        _read(kernel_id, tmp_path)  # not waited on


def test_a_python_without_jsonschema_refuses_a_state_it_cannot_check_in_one_line(
        tmp_path: Path, lookalike_kernel: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel's Python reads its other kernels' states for `%tfgpu who`, and need not have jsonschema (the
    server has it through jupyter_events): the state is refused as unchecked, never a traceback."""
    kernel_id, pid = lookalike_kernel
    _write_state(kernelstate.state_path(kernel_id, tmp_path), **valid_state(kernel_id, pid))
    kernelstate._checked.clear()
    kernelstate._validator.cache_clear()
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # importing it raises ImportError
    try:
        with pytest.raises(kernelstate.StateInvalid, match="^it cannot be checked here: jsonschema is not installed") as raised:
            _read(kernel_id, tmp_path)
        assert raised.value.code == "jsonschema_missing"
    finally:
        kernelstate._validator.cache_clear()


def test_an_old_jsonschema_is_reported_as_old_not_missing_and_the_reply_says_which(
        tmp_path: Path, lookalike_kernel: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A jsonschema before 4.0 has no validator for the schema's draft: the state is refused with
    `jsonschema_old` (never "not installed", never `state_invalid`), and the kernel's reply carries that code."""
    kernel_id, pid = lookalike_kernel
    _write_state(kernelstate.state_path(kernel_id, tmp_path), **valid_state(kernel_id, pid))
    kernelstate._checked.clear()
    kernelstate._validator.cache_clear()
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "jsonschema", SimpleNamespace(Draft7Validator=object))  # as 3.2 has
        kernel = gather.read_kernel(kernel_id, None, tmp_path, gather.TensorFlowSeen())
    kernelstate._validator.cache_clear()
    assert kernel.invalid_code == "jsonschema_old" and kernel.state is None
    assert "older than 4.0" in kernel.invalid and "not installed" not in kernel.invalid
    reply = conforms(gather.kernel_reply(kernel, gather.Machine(None), None, datetime.now(timezone.utc)), "kernelReply")
    assert reply["error"]["code"] == "jsonschema_old" and not reply["published"]


def test_a_state_file_of_another_version_is_refused_as_state_invalid_in_one_line(
        tmp_path: Path, lookalike_kernel: tuple[str, int]) -> None:
    """A kernel of another tfgpu_magic (a server upgraded under running kernels): version 3's file, whose
    `format` ended in its version and which had no `version`, and files of the next and the previous version,
    are each refused with `state_invalid`, naming what the file says and what this server reads; the kernel's
    reply says so and the schema accepts the reply."""
    kernel_id, pid = lookalike_kernel
    path = kernelstate.state_path(kernel_id, tmp_path)
    good = valid_state(kernel_id, pid)
    version = kernelstate.schema_version()
    version_3 = {key: value for key, value in good.items() if key != "version"} | {
        "format": f"{kernelstate.FORMAT}/3"}
    for record, says in ((version_3, f"'{kernelstate.FORMAT}/3' version None"),
                         ({**good, "version": version + 1}, f"version {version + 1},"),
                         ({**good, "version": version - 1}, f"version {version - 1},")):
        _write_state(path, **record)
        with pytest.raises(kernelstate.StateInvalid) as refused:
            _read(kernel_id, tmp_path)
        message = str(refused.value)
        assert refused.value.code == kernelstate.STATE_INVALID and "\n" not in message
        assert says in message and f"not '{kernelstate.FORMAT}' version {version}" in message, message
        kernel = gather.read_kernel(kernel_id, None, tmp_path, gather.TensorFlowSeen())
        assert kernel.state is None and kernel.invalid_code == kernelstate.STATE_INVALID
        reply = conforms(gather.kernel_reply(kernel, gather.Machine(None), None, datetime.now(timezone.utc)),
                         "kernelReply")
        assert reply["error"]["code"] == "state_invalid" and not reply["published"]
    _write_state(path, **good)
    assert _read(kernel_id, tmp_path)["version"] == version  # the same file of this version is read


@pytest.mark.parametrize("name, hostile", HOSTILE_STATES, ids=[name for name, _ in HOSTILE_STATES])
def test_a_hostile_state_file_is_refused_in_one_line(tmp_path: Path, lookalike_kernel: tuple[str, int], name: str,
                                                      hostile: Callable[[dict[str, Any]], str]) -> None:
    kernel_id, pid = lookalike_kernel
    path = kernelstate.state_path(kernel_id, tmp_path)
    _write_state(path, text=hostile(valid_state(kernel_id, pid)))
    with pytest.raises(kernelstate.StateInvalid) as refused:
        _read(kernel_id, tmp_path)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 1200


def test_a_hostile_state_spoils_only_its_own_kernels_entry(api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """Two real kernels publish; one's file is replaced by each hostile variant in turn (and a GPU named
    `²`, which is no index): the GPU list and the other kernel answer as before, the spoiled kernel says
    its state is not valid, and no reply carries NaN."""
    good, spoiled = (NotebookKernel(api, jp_serverapp, name) for name in ("good.ipynb", "spoiled.ipynb"))
    try:
        good.publish("visible 1", "growth on")
        spoiled.publish("growth on")
        fake_nvml.gpus[1].processes = [(good.pid, 1024)]
        before = api.kernel(good.kernel_id)
        path = kernelstate.state_path(spoiled.kernel_id, Path(jp_serverapp.runtime_dir))
        written = json.loads(path.read_text())
        variants = [hostile(written) for _, hostile in HOSTILE_STATES]
        odd_gpu = {**written, "policy": {**written["policy"], "visible": ["²"]}}
        for text in [*variants, json.dumps(odd_gpu)]:
            _write_state(path, text=text)
            assert api.gpus()["gpus"][1]["processes"][0]["kernel"]["kernel_id"] == good.kernel_id
            assert "NaN" not in api.last.body.decode()
            assert api.kernel(good.kernel_id)["policy"] == before["policy"]
            reply = api.kernel(spoiled.kernel_id)
            if text in variants:
                assert not reply["published"] and reply["error"]["code"] == "state_invalid", text[:80]
            else:
                assert reply["published"] and reply["gpus_from"] == "policy" and reply["gpus"] == []
    finally:
        good.kernel.close()
        spoiled.kernel.close()


# ----- the kernel side -----------------------------------------------------------------------------
def kernel_shell(connection_file: Path, profile: Path | None = None) -> Any:
    """What `start_publishing` reads of a shell: its kernel's application and connection file, and the
    IPython profile a kept policy's startup file goes to."""
    return SimpleNamespace(kernel=SimpleNamespace(parent=SimpleNamespace(abs_connection_file=str(connection_file))),
                           profile_dir=SimpleNamespace(location=str(profile)) if profile else None)


@pytest.fixture
def fake_kernel(tmp_path: Path) -> Iterator[tuple[FakeTF, Controller, Path]]:
    """A controller over a fake TensorFlow (imported, two GPUs), in a kernel a server named `kernel-k1.json`."""
    fake = FakeTF(2)
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    controller = Controller(api=fake, environ={}, catalog=catalog)
    (tmp_path / "runtime").mkdir()
    yield fake, controller, tmp_path / "runtime" / "kernel-k1.json"
    kernelstate.stop_publishing()


def _published(path: Path) -> dict[str, Any]:
    return conforms(json.loads(path.read_text()), "kernelState")


def test_the_state_is_written_on_change_only_and_removed_when_publishing_stops(
        fake_kernel: tuple[FakeTF, Controller, Path], tmp_path: Path) -> None:
    fake, controller, connection = fake_kernel
    publisher = kernelstate.start_publishing(kernel_shell(connection, tmp_path / "profile"), controller)
    path = kernelstate.state_path("k1", connection.parent)
    assert publisher is not None and publisher.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    first = _published(path)
    assert (first["kernel_id"], first["pid"], first["tensorflow"]["state"]) == ("k1", os.getpid(), "imported")
    assert first["policy"] == kernelstate.policy_record(Policy()) and first["pending"] == [] and first["keep"]
    assert persist.startup_path(tmp_path / "profile", persist.PENDING_STARTUP_NAME).is_file()  # what `keep` means
    controller.edit([controller.parse("growth on")])
    writes = publisher.writes
    assert _published(path)["policy"]["growth"] is True and writes > 1
    assert kernelstate.changed() is False and publisher.writes == writes  # nothing changed: nothing written
    assert kernelstate.start_publishing(kernel_shell(connection), controller) is publisher
    kernelstate.stop_publishing()
    assert not path.exists()
    controller.edit([controller.parse("growth off")])
    assert not path.exists()  # unsubscribed


def test_without_a_profile_nothing_can_be_kept(fake_kernel: tuple[FakeTF, Controller, Path]) -> None:
    _, controller, connection = fake_kernel
    kernelstate.start_publishing(kernel_shell(connection), controller)
    assert _published(kernelstate.state_path("k1", connection.parent))["keep"] is False


def test_initialization_and_a_change_that_waits_for_a_restart_are_published_as_records(
        fake_kernel: tuple[FakeTF, Controller, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from tfgpu_magic.tf import initcell

    fake, controller, connection = fake_kernel
    kernelstate.start_publishing(kernel_shell(connection), controller)
    path = kernelstate.state_path("k1", connection.parent)
    fake.initialize()
    monkeypatch.setattr(initcell, "_record", initcell.InitRecord("cell", 3, "x = tf.ones(3)"))
    assert kernelstate.changed() is True
    state = _published(path)
    assert state["tensorflow"]["state"] == "initialized"
    assert state["tensorflow"]["initialized_by"] == {"where": "cell", "execution_count": 3, "line": "x = tf.ones(3)"}
    controller.edit([controller.parse("split 0 2x1GB")])
    published = _published(path)
    assert published["pending"] == [{"setting": "logical", "device": "GPU:0", "now": None,
                                     "wanted": [{"memory": GIB}, {"memory": GIB}], "why": "initialized",
                                     "needs_restart": True}]
    assert published["restart_needed"] is True


def test_the_policy_record_round_trips_with_how_sizes_were_written() -> None:
    """What the server keeps for the next kernel is the policy the kernel published, notes included."""
    from tfgpu_magic.controller import Controller as Fresh

    controller = Fresh(api=FakeTF(2), environ={}, catalog=InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus())))))
    policy = controller.edit_policy(["visible auto:2", "limit 50%", "split cpu 3", "loglevel error", "growth on"])
    record = conforms(kernelstate.policy_record(policy), "policy")
    assert record["visible_auto"] and record["limits"][0]["written"] == "50%"
    back = kernelstate.policy_from_record(record)
    assert back == policy and back.limits_written == policy.limits_written and back.picked_automatically


def test_nothing_is_published_outside_a_server_kernel(fake_kernel: tuple[FakeTF, Controller, Path], tmp_path: Path) -> None:
    _, controller, connection = fake_kernel
    assert kernelstate.start_publishing(SimpleNamespace(kernel=None), controller) is None
    assert kernelstate.start_publishing(kernel_shell(connection.parent / "tmpab12cd.json"), controller) is None  # nbclient's name
    assert kernelstate.changed() is False and list(connection.parent.iterdir()) == []


def test_a_successors_file_is_left_in_place(fake_kernel: tuple[FakeTF, Controller, Path]) -> None:
    """After a restart the new kernel (another pid) owns the file: the old one's exit keeps it."""
    _, controller, connection = fake_kernel
    kernelstate.start_publishing(kernel_shell(connection), controller)
    path = kernelstate.state_path("k1", connection.parent)
    _write_state(path, **valid_state("k1", os.getpid() + 1))
    kernelstate.stop_publishing()
    assert path.exists()


def test_a_write_that_fails_warns_once_and_the_kernel_goes_on(
        fake_kernel: tuple[FakeTF, Controller, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, controller, connection = fake_kernel
    kernelstate.state_path("k1", connection.parent).symlink_to(connection.parent / "elsewhere")
    publisher = kernelstate.start_publishing(kernel_shell(connection), controller)
    controller.edit([controller.parse("growth on")])
    assert publisher is not None and publisher.writes == 0
    assert capsys.readouterr().err.count("could not publish this kernel's state") == 1
    assert not (connection.parent / "elsewhere").exists()


def test_the_server_reads_what_the_kernel_published(fake_kernel: tuple[FakeTF, Controller, Path],
                                                    lookalike_kernel: tuple[str, int], tmp_path: Path) -> None:
    """The kernel's record and the server's reader agree field by field (the pid swapped for a process
    that runs a kernel of that id, as the kernel's own pid would)."""
    _, controller, _ = fake_kernel
    kernel_id, pid = lookalike_kernel
    controller.edit([controller.parse("visible 1"), controller.parse("limit 4GB")])
    record = kernelstate.snapshot(controller, kernel_id, keep=True)
    path = kernelstate.state_path(kernel_id, tmp_path)
    _write_state(path, **{**record, "pid": pid, "written": 1.0})
    read = _read(kernel_id, tmp_path)
    assert read is not None and read["policy"] == record["policy"] and read["pending"] == record["pending"]
    process = gather.KernelProcess(kernel_id, pid, read)
    machine = gather.Machine(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    reply = conforms(gather.kernel_reply(process, machine, None, datetime.now(timezone.utc)), "kernelReply")
    assert reply["gpus_from"] == "policy" and [gpu["index"] for gpu in reply["gpus"]] == [1]
    assert reply["policy"]["limits"] == [{"gpu": "all", "bytes": 4 * GIB, "written": None}]


def test_the_schema_names_every_setting_and_reason_the_records_carry() -> None:
    """The closed sets the kernel writes (`tf.apply`'s literals) are the schema's enums, one for one."""
    from typing import get_args

    from tfgpu_magic.tf.apply import LockReason, Setting

    defs = json.loads(kernelstate.SCHEMA.read_text(encoding="utf-8"))["$defs"]
    assert set(get_args(LockReason)) == set(defs["lockReason"]["enum"])
    assert set(get_args(Setting)) == set(defs["pendingChange"]["properties"]["setting"]["enum"])
    assert conforms({"setting": "growth", "device": "GPU:0", "now": None, "wanted": True, "why": None,
                     "needs_restart": False}, "pendingChange")


def test_pytorch_imported_or_started_in_a_cell_is_published_after_that_cell(tmp_path: Path) -> None:
    """PyTorch (and JAX) tell nobody when they are imported or start: the publisher looks after each
    cell (IPython's `post_run_cell`, a real `EventManager`) and writes only when that changed; it stops
    looking when publishing stops."""
    from fake_torch import FakeTorch
    from IPython.core.events import EventManager, available_events

    env: dict[str, str] = {}
    fake = FakeTF(2, environ=env)
    torch = FakeTorch(environ=env, tf=fake)
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    controller = Controller(api=fake, environ=env, catalog=catalog, torch=torch)
    (tmp_path / "runtime").mkdir()
    shell = kernel_shell(tmp_path / "runtime" / "kernel-k1.json")
    shell.events = EventManager(shell, available_events)
    path = kernelstate.state_path("k1", tmp_path / "runtime")
    try:
        publisher = kernelstate.start_publishing(shell, controller)
        assert publisher is not None and _published(path)["frameworks"]["torch"] is None
        cell = lambda: shell.events.trigger("post_run_cell", None)  # noqa: E731 (what IPython does after a cell)
        torch.import_torch()  # a cell's `import torch`: no event
        writes = publisher.writes
        cell()
        assert publisher.writes == writes + 1 and _published(path)["frameworks"]["torch"]["state"] == "imported"
        cell()
        assert publisher.writes == writes + 1  # nothing changed: nothing written
        torch.allocate(0, 512)  # a cell's first CUDA op
        cell()
        record = _published(path)["frameworks"]["torch"]
        assert record["state"] == "started" and record["memory"][0]["current"] == 512 * MIB
        kernelstate.stop_publishing()
        assert shell.events.callbacks["post_run_cell"] == []
    finally:
        kernelstate.stop_publishing()


def test_tensorflows_own_memory_figures_are_published_and_followed_while_they_move(
        fake_kernel: tuple[FakeTF, Controller, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-kernel figure a server in a container can show: each GPU's `get_memory_info`, with the
    card it is on, read again every `MEMORY_SECONDS` once the runtime is initialized (a cell that runs
    for minutes moves it without any event)."""
    from fake_memory import FakeMemory

    fake, controller, connection = fake_kernel
    monkeypatch.setattr(kernelstate, "MEMORY_SECONDS", 0.05)
    memory = FakeMemory(fake)
    kernelstate.start_publishing(kernel_shell(connection), controller, memory_api=memory)
    path = kernelstate.state_path("k1", connection.parent)
    assert _published(path)["tensorflow"]["memory"] == []  # not initialized: nothing read
    fake.initialize()
    memory.allocate("GPU:1", 3 * GIB)
    kernelstate.changed()
    figures = _published(path)["tensorflow"]["memory"]
    uuid = read_inventory(Nvml(module=FakeNvml(four_gpus()))).gpus[1].uuid
    assert figures[1] == {"device": "GPU:1", "card": uuid, "current": 3 * GIB, "peak": 3 * GIB}
    memory.free("GPU:1", 2 * GIB)  # no event: the watch sees it
    wait_until(lambda: _published(path)["tensorflow"]["memory"][1]["current"] == GIB, 10, "the watch publishing the figure")
    kernelstate.stop_publishing()
    memory.allocate("GPU:1", GIB)
    assert not path.exists()


def test_in_a_container_pids_are_not_matched_and_kernels_show_tensorflows_figure(
        lookalike_kernel: tuple[str, int]) -> None:
    """NVML's pids are the host's: a host process whose pid equals the kernel's in-container pid is not
    the kernel. The kernel's memory comes from what it published, labelled TensorFlow's."""
    kernel_id, pid = lookalike_kernel
    fake = FakeNvml(four_gpus(this_kernel=False))
    fake.gpus[2].processes = [(pid, 5000)]  # a host process that happens to have the kernel's pid
    inventory = read_inventory(Nvml(module=fake))
    state = valid_state(kernel_id, pid)
    state["tensorflow"] = {**state["tensorflow"], "state": "initialized",
                           "memory": [{"device": "GPU:0", "card": inventory.gpus[1].uuid, "current": 7 * GIB, "peak": 8 * GIB}]}
    kernel = gather.KernelProcess(kernel_id, pid, state)
    now = datetime.now(timezone.utc)
    machine = gather.Machine(inventory, host_pids=True)
    reply = conforms(gather.gpus_reply(machine, {kernel_id: kernel}, {}, {}, now), "gpusReply")
    host_row = reply["gpus"][2]["processes"][0]
    assert (host_row["pid"], host_row["kernel"], host_row["mine"], host_row["memory_source"]) == (pid, None, False, "nvml")
    (own,) = [row for row in reply["gpus"][1]["processes"] if row["kernel"]]
    assert (own["gpu_memory"], own["memory_source"], own["kernel"]["kernel_id"]) == (7 * GIB, "tensorflow", kernel_id)
    assert reply["gpu_status"]["host_pids"] is True
    mine = conforms(gather.kernel_reply(kernel, machine, None, now), "kernelReply")
    assert mine["gpus_from"] == "memory" and mine["gpus"][0]["index"] == 1
    assert (mine["gpus"][0]["kernel_memory"], mine["gpus"][0]["memory_source"]) == (7 * GIB, "tensorflow")
    outside = conforms(gather.gpus_reply(gather.Machine(inventory), {kernel_id: kernel}, {}, {}, now), "gpusReply")
    assert outside["gpus"][2]["processes"][0]["kernel"]["kernel_id"] == kernel_id  # on the host: matched by pid


def test_the_server_reads_only_what_a_reply_shows_of_other_processes(
        api: Api, fake_nvml: RecordingNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten processes of this user on the cards (not kernels): their status files are read for the
    owner, never their memory maps (up to 16 MiB each), which no reply shows."""

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(10)]
    read: list[str] = []
    real = processes.read_capped
    monkeypatch.setattr(processes, "read_capped", lambda path, cap: read.append(str(path)) or real(path, cap))
    try:
        fake_nvml.gpus[2].processes = [(child.pid, 100) for child in children]
        reply = api.gpus()
    finally:
        for child in children:
            child.kill()
            child.wait(10)
    rows = reply["gpus"][2]["processes"]
    assert [row["pid"] for row in rows] == [child.pid for child in children] and all(row["mine"] for row in rows)
    assert not [path for path in read if path.endswith("/maps")], read
    on_cards = {row["pid"] for gpu in reply["gpus"] for row in gpu["processes"]}
    assert sorted(path for path in read if path.endswith("/status")) == sorted(f"/proc/{pid}/status" for pid in on_cards)


# ----- a wedged driver ------------------------------------------------------------------------------
WEDGED_SERVER_CONFIG = """# Written by tests/test_serverext.py: NVML's memory call hangs {hang} s after the first read.
import sys, threading
sys.path.insert(0, {tests!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus import inventory

FAKE = FakeNvml(four_gpus(this_kernel=False))
NVML = inventory.Nvml(module=FAKE, deadline={deadline})
inventory.read_inventory(NVML)  # one good reading, then the driver stops answering
FAKE.block["nvmlDeviceGetMemoryInfo"] = {hang}
inventory.shared_nvml = lambda: NVML
c.ServerApp.jpserver_extensions.update({{"tfgpu_magic.serverext": True}})
"""


def test_a_wedged_driver_serves_the_last_reading_marked_stale_and_the_kernel_endpoint_never_waits(
        api: Api, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfgpu_magic.gpus.inventory import NOT_ANSWERING

    release = threading.Event()
    fake = FakeNvml(four_gpus(this_kernel=False))
    nvml = Nvml(module=fake, deadline=0.5)
    monkeypatch.setattr(inventory, "shared_nvml", lambda: nvml)
    notebook = NotebookKernel(api, jp_serverapp, "wedged.ipynb")
    try:
        notebook.publish("visible 2")
        assert api.gpus()["gpu_status"]["stale_seconds"] is None  # a good reading first
        fake.block["nvmlDeviceGetMemoryInfo"] = release
        started = time.monotonic()
        reply = api.gpus()
        took = time.monotonic() - started
        status = reply["gpu_status"]
        assert status["error"]["code"] == "driver_not_answering" and NOT_ANSWERING in status["error"]["message"]
        assert status["stale_seconds"] is not None and [gpu["index"] for gpu in reply["gpus"]] == [0, 1, 2, 3]
        assert took < 0.5 + 2.0, took  # the deadline, not the hang
        for _ in range(3):
            started = time.monotonic()
            mine = api.kernel(notebook.kernel_id)
            assert time.monotonic() - started < 0.5 and mine["gpus"][0]["index"] == 2
    finally:
        release.set()
        notebook.kernel.close()


def test_the_server_stops_within_seconds_of_sigterm_while_nvml_hangs() -> None:
    """No thread of ours keeps the process alive: a read stuck in the driver runs in a daemon thread."""
    from servers import isolated_jupyter, running_server, stop_pids

    with isolated_jupyter("tfgpu-wedged-") as env:
        text = WEDGED_SERVER_CONFIG.format(tests=str(Path(__file__).resolve().parent), hang=600, deadline=1.0)
        (env.config_dir / "jupyter_server_config.py").write_text(text, encoding="utf-8")
        with running_server(env) as server:
            started = time.monotonic()
            reply = server.request("GET", "api/tfgpu/gpus")
            assert reply["gpu_status"]["error"]["code"] == "driver_not_answering", reply
            assert time.monotonic() - started < 1.0 + 3.0
            started = time.monotonic()
            stop_pids([server.process.pid], timeout=60)
            exited = time.monotonic() - started
    assert exited < 10, f"the server took {exited:.1f} s to exit"


def test_cards_outside_the_servers_grant_are_marked_and_an_unplaced_grant_claims_nothing() -> None:
    """The server's `CUDA_VISIBLE_DEVICES` (a Slurm job's or a container's grant): its kernels inherit it,
    so the other cards are marked. Indices in CUDA's default order cannot be placed: nothing is marked."""
    from tfgpu_magic.gpus.cudaenv import grant_of

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    now = datetime.now(timezone.utc)
    for value, order, granted in [(inventory.gpus[2].uuid[:12], None, [2]), ("1,3", "PCI_BUS_ID", [1, 3]),
                                  ("1,3", None, [0, 1, 2, 3]), (None, None, [0, 1, 2, 3])]:
        machine = gather.Machine(inventory, grant=grant_of(value, order, inventory))
        reply = conforms(gather.gpus_reply(machine, {}, {}, {}, now), "gpusReply")
        assert [gpu["index"] for gpu in reply["gpus"] if gpu["granted"]] == granted, (value, order)


# ----- faults: a state the schema accepts that a sum or the policy refuses ------------------------------
def _replace_state(notebook: NotebookKernel, serverapp: Any, edit: Callable[[dict[str, Any]], None]) -> None:
    """Stop the kernel's own publishing, then write its state as it was with `edit` applied (as a kernel
    of another tfgpu_magic, or a hostile one, could)."""
    path = kernelstate.state_path(notebook.kernel_id, Path(serverapp.runtime_dir))
    record = json.loads(path.read_text())
    notebook.kernel.ok("from tfgpu_magic.jupyter import kernelstate\nkernelstate.stop_publishing()")
    edit(record)
    _write_state(path, **record)


def test_in_a_container_huge_figures_neither_overflow_nor_spoil_the_gpu_list(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two memory figures of 1e308 (a JSON integer) would sum to infinity: the schema's maximum refuses
    them (that kernel's entry says so, the list answers); two valid figures of the maximum sum to the
    maximum, never past it."""
    monkeypatch.setattr(processes, "foreign_pid_namespace", lambda: True)
    notebook = NotebookKernel(api, jp_serverapp, "huge.ipynb")
    uuid = read_inventory(Nvml(module=FakeNvml(four_gpus()))).gpus[1].uuid
    try:
        notebook.publish("growth on")

        def figures(value: float) -> Callable[[dict[str, Any]], None]:
            def edit(record: dict[str, Any]) -> None:
                record["tensorflow"].update(state="initialized", memory=[
                    {"device": f"GPU:{n}", "card": uuid, "current": value, "peak": value} for n in (0, 1)])
            return edit

        _replace_state(notebook, jp_serverapp, figures(1e308))
        reply = api.gpus()
        assert not [row for gpu in reply["gpus"] for row in gpu["processes"] if row["kernel"]]
        assert api.kernel(notebook.kernel_id)["error"]["code"] == "state_invalid"
        _replace_state(notebook, jp_serverapp, figures(kernelstate.BYTES_MAX))
        (own,) = [row for row in api.gpus()["gpus"][1]["processes"] if row["kernel"]]
        assert own["gpu_memory"] == kernelstate.BYTES_MAX and own["memory_source"] == "tensorflow"
        assert api.kernel(notebook.kernel_id)["gpus"][0]["kernel_memory"] == kernelstate.BYTES_MAX
    finally:
        notebook.kernel.close()


def test_keep_answers_409_for_a_published_policy_the_rules_refuse(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    """A limit and a split on one GPU: each valid for the schema, together refused by `Policy.validate`.
    A conflict in one line, nothing stored, never a 500."""
    notebook = NotebookKernel(api, jp_serverapp, "refused.ipynb")
    try:
        notebook.publish("growth on")

        def contradict(record: dict[str, Any]) -> None:
            record["policy"].update(growth=None, limits=[{"gpu": "0", "bytes": 2 * GIB, "written": None}],
                                    splits=[{"gpu": "0", "bytes": [GIB, GIB]}])

        _replace_state(notebook, jp_serverapp, contradict)
        refused = api.refused(409, "POST", "api", "tfgpu", "kernels", notebook.kernel_id, "keep")
        message = refused["message"]
        assert refused["code"] == "policy_refused"
        assert "both a limit and a split" in message and "\n" not in message
        assert not persist.pending_path(notebook.kernel_id, Path(jp_serverapp.runtime_dir)).exists()
    finally:
        notebook.kernel.close()

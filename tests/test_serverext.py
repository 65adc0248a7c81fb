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
from servers import JupyterEnv, dead_pid, wait_until
from tornado.httpclient import HTTPClientError

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus import inventory
from tfgpu_magic.gpus.inventory import MIB, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.jupyter import kernelstate
from tfgpu_magic.serverext import gather
from tfgpu_magic.views.status import change_text

ROOT = Path(__file__).resolve().parents[1]
EXTENSION_CONFIG = ROOT / "jupyter-config" / "jupyter_server_config.d" / "tfgpu_magic.json"
XSS_NOTEBOOK = "<img src=x onerror=alert(1)>.ipynb"
GIB = 1024 * MIB


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
        return self.call("GET", "api", "tfgpu", "gpus")

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        return self.call("GET", "api", "tfgpu", "kernels", kernel_id)

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
    assert reply["error"] is None and [gpu["index"] for gpu in reply["gpus"]] == [0, 1, 2, 3]
    gpu0, gpu1 = reply["gpus"][0], reply["gpus"][1]
    assert (gpu0["memory_used"], gpu0["memory_total"], gpu0["utilization"]) == (20480 * MIB, 80 * GIB, 50)
    assert reply["gpus"][3]["mig"] and reply["gpus"][3]["memory_total"] == 40 * GIB
    (row,) = gpu1["processes"]
    assert row["pid"] == notebook.pid and row["mine"] and row["gpu_memory"] == 2 * GIB
    assert (row["kernel_id"], row["notebook"], row["tensorflow"]) == (
        notebook.kernel_id, f"sub/{XSS_NOTEBOOK}", "not imported")
    assert row["execution_state"] in ("idle", "busy") and row["user"]
    me, other = gpu0["processes"]
    assert me["pid"] == os.getpid() and me["mine"] and "notebook" not in me and "kernel_id" not in me
    assert set(other) == {"pid", "user", "gpu_memory", "mine"} and other["gpu_memory"] == 19456 * MIB
    assert other["user"] is None and not other["mine"]


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
            return reply if reply["execution_state"] == "busy" else None

        reply = wait_until(busy, 30, "the server seeing the kernel busy")
        assert reply["published"] and reply["policy"]["visible"] == ["1"] and reply["policy"]["growth"] is True
        assert reply["settings"] == ["growth on"] and reply["tensorflow"] == "not imported"
        assert reply["gpus_from"] == "policy"
        assert reply["gpus"] == [{"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GIB,
                                  "kernel_memory": 3 * GIB}]
        assert (reply["notebook"], reply["pid"], reply["idle_seconds"]) == ("a.ipynb", notebook.pid, None)
        assert not reply["restart_needed"] and reply["pending"] == []
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
    assert first["published"] and first["settings"] == [] and first["tensorflow"] == "not imported"
    assert second["settings"] == ["growth on"] and second["gpus_from"] == "all" and len(second["gpus"]) == 4


def test_without_auth_both_endpoints_answer_403_and_an_unknown_kernel_404(api: Api, fake_nvml: RecordingNvml) -> None:
    for parts in (("api", "tfgpu", "gpus"), ("api", "tfgpu", "kernels", "0a1b2c3d-0000-4000-8000-000000000000")):
        with pytest.raises(HTTPClientError) as refused:
            api.call("GET", *parts, headers={"Authorization": ""})
        assert refused.value.code == 403
    with pytest.raises(HTTPClientError) as missing:
        api.kernel("0a1b2c3d-0000-4000-8000-000000000000")
    assert missing.value.code == 404
    assert fake_nvml.threads == []  # refused before anything was read


def test_reads_run_off_the_event_loop_and_one_reading_serves_the_cache_period(
        api: Api, jp_serverapp: Any, fake_nvml: RecordingNvml) -> None:
    readings = jp_serverapp.web_app.settings["tfgpu_readings"]
    readings.cache_seconds = 60
    for _ in range(3):
        api.gpus()
    assert len(fake_nvml.threads) == 1 and threading.current_thread().name not in fake_nvml.threads
    readings.cache_seconds = 0
    api.gpus()
    assert len(fake_nvml.threads) == 2
    assert api.last.headers["Server-Timing"].startswith("tfgpu;dur=")


def test_without_nvml_the_cards_are_empty_with_the_reason(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = Nvml(module=FakeNvml([], init_error=9))
    monkeypatch.setattr(inventory, "shared_nvml", lambda: nvml)
    reply = api.gpus()
    assert reply["gpus"] == [] and "NVML could not start: Driver Not Loaded" in reply["error"]


# ----- the published state, read as hostile ----------------------------------------------------------
@pytest.fixture
def lookalike_kernel(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A process whose command line is a server kernel's (`ipykernel_launcher -f .../kernel-<id>.json`)."""
    kernel_id = "5e1f0c2a-1111-4222-8333-444455556666"
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "ipykernel_launcher", "-f",
            str(tmp_path / f"kernel-{kernel_id}.json")]
    process = subprocess.Popen(argv)
    try:
        wait_until(lambda: gather.runs_kernel(process.pid, kernel_id), 30, "the lookalike's command line (after exec)")
        yield kernel_id, process.pid
    finally:
        process.kill()
        process.wait(10)


def _write_state(path: Path, mode: int = 0o600, **fields: Any) -> None:
    path.write_text(json.dumps({"format": kernelstate.FORMAT, "tensorflow": "imported", "policy": {"growth": True},
                                "policy_text": ["growth on"], "pending": [], **fields}))
    path.chmod(mode)


def test_a_published_state_is_trusted_only_from_the_process_running_that_kernel(
        tmp_path: Path, lookalike_kernel: tuple[str, int]) -> None:
    kernel_id, pid = lookalike_kernel
    path = kernelstate.state_path(kernel_id, tmp_path)
    _write_state(path, kernel_id=kernel_id, pid=pid)
    assert gather.read_state(kernel_id, tmp_path)["policy_text"] == ["growth on"]
    for fields, mode in [({"pid": dead_pid()}, 0o600), ({"pid": os.getpid()}, 0o600), ({}, 0o622),
                         ({"kernel_id": "another"}, 0o600), ({"format": "x"}, 0o600), ({"tensorflow": "yes"}, 0o600)]:
        _write_state(path, mode, **{"kernel_id": kernel_id, "pid": pid, **fields})
        assert gather.read_state(kernel_id, tmp_path) is None, (fields, oct(mode))
    path.write_text("{" * 100_000)
    path.chmod(0o600)
    assert gather.read_state(kernel_id, tmp_path) is None  # over the cap
    path.unlink()
    os.mkfifo(path)
    assert gather.read_state(kernel_id, tmp_path) is None  # not waited on


# ----- the kernel side -----------------------------------------------------------------------------
def kernel_shell(connection_file: Path) -> Any:
    """What `start_publishing` reads of a shell: its kernel's application and connection file."""
    return SimpleNamespace(kernel=SimpleNamespace(parent=SimpleNamespace(abs_connection_file=str(connection_file))))


@pytest.fixture
def fake_kernel(tmp_path: Path) -> Iterator[tuple[FakeTF, Controller, Path]]:
    """A controller over a fake TensorFlow (imported, two GPUs), in a kernel a server named `kernel-k1.json`."""
    fake = FakeTF(2)
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    controller = Controller(api=fake, environ={}, catalog=catalog)
    yield fake, controller, tmp_path / "kernel-k1.json"
    kernelstate.stop_publishing()


def _published(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_state_is_written_on_change_only_and_removed_when_publishing_stops(
        fake_kernel: tuple[FakeTF, Controller, Path]) -> None:
    fake, controller, connection = fake_kernel
    publisher = kernelstate.start_publishing(kernel_shell(connection), controller, word=change_text)
    path = kernelstate.state_path("k1", connection.parent)
    assert publisher is not None and publisher.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    first = _published(path)
    assert (first["kernel_id"], first["pid"], first["tensorflow"]) == ("k1", os.getpid(), "imported")
    assert first["policy_text"] == [] and first["pending"] == []
    controller.edit([controller.parse("growth on")])
    writes = publisher.writes
    assert _published(path)["policy"]["growth"] is True and writes > 1
    assert kernelstate.changed() is False and publisher.writes == writes  # nothing changed: nothing written
    assert kernelstate.start_publishing(kernel_shell(connection), controller, word=change_text) is publisher
    kernelstate.stop_publishing()
    assert not path.exists()
    controller.edit([controller.parse("growth off")])
    assert not path.exists()  # unsubscribed


def test_initialization_and_a_change_that_waits_for_a_restart_are_published(
        fake_kernel: tuple[FakeTF, Controller, Path]) -> None:
    fake, controller, connection = fake_kernel
    kernelstate.start_publishing(kernel_shell(connection), controller, word=change_text)
    path = kernelstate.state_path("k1", connection.parent)
    fake.initialize()
    assert kernelstate.changed(initialized_by="by In [3]: `x = tf.ones(3)`") is True
    state = _published(path)
    assert (state["tensorflow"], state["initialized_by"]) == ("initialized", "by In [3]: `x = tf.ones(3)`")
    controller.edit([controller.parse("split 0 2x1GB")])
    (group,) = _published(path)["pending"]
    assert group == {"title": kernelstate.RESTART_TITLE,
                     "items": ["logical devices of GPU:0: TF default → 1024 MiB + 1024 MiB"]}


def test_nothing_is_published_outside_a_server_kernel(fake_kernel: tuple[FakeTF, Controller, Path], tmp_path: Path) -> None:
    _, controller, _ = fake_kernel
    assert kernelstate.start_publishing(SimpleNamespace(kernel=None), controller, word=change_text) is None
    assert kernelstate.start_publishing(kernel_shell(tmp_path / "tmpab12cd.json"), controller, word=change_text) is None  # nbclient's name
    assert kernelstate.changed() is False and list(tmp_path.iterdir()) == []


def test_a_successors_file_is_left_in_place(fake_kernel: tuple[FakeTF, Controller, Path]) -> None:
    """After a restart the new kernel (another pid) owns the file: the old one's exit keeps it."""
    _, controller, connection = fake_kernel
    kernelstate.start_publishing(kernel_shell(connection), controller, word=change_text)
    path = kernelstate.state_path("k1", connection.parent)
    _write_state(path, kernel_id="k1", pid=os.getpid() + 1)
    kernelstate.stop_publishing()
    assert path.exists()


def test_a_write_that_fails_warns_once_and_the_kernel_goes_on(
        fake_kernel: tuple[FakeTF, Controller, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, controller, connection = fake_kernel
    kernelstate.state_path("k1", connection.parent).symlink_to(connection.parent / "elsewhere")
    publisher = kernelstate.start_publishing(kernel_shell(connection), controller, word=change_text)
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
    record = kernelstate.snapshot(controller, kernel_id, None, change_text)
    path = kernelstate.state_path(kernel_id, tmp_path)
    path.write_text(json.dumps({**record, "pid": pid}))
    path.chmod(0o600)
    read = gather.read_state(kernel_id, tmp_path)
    assert read is not None and read["policy"] == record["policy"] and read["policy_text"] == record["policy_text"]
    process = gather.KernelProcess(kernel_id, pid, read, None)
    reading = gather.Reading(read_inventory(Nvml(module=FakeNvml(four_gpus()))), {kernel_id: process})
    reply = gather.kernel_reply(process, reading, None, datetime.now(timezone.utc))
    assert reply["gpus_from"] == "policy" and [gpu["index"] for gpu in reply["gpus"]] == [1]
    assert reply["settings"] and all(not phrase.startswith("visible") for phrase in reply["settings"])

"""`tfgpu_magic.who()`: processes → kernels → notebooks → GPU memory, without touching any process.

A real `jupyter_server` on 127.0.0.1 holds two notebooks' sessions (created over REST), one kernel
has imported real TensorFlow (CPU); NVML is the fake at its chokepoint, with the kernels' real pids
as GPU holders. The server's token must never appear in anything `who` returns or prints.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
from fake_nvml import OTHER_PID, FakeNvml, four_gpus
from servers import JupyterServer, RecordingListener, isolated_jupyter, running_server, wait_until, write_server_file

from tfgpu_magic import holders
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus import processes
from tfgpu_magic.gpus.inventory import MIB, Inventory, Nvml, read_inventory
from tfgpu_magic.jupyter import sessions
from tfgpu_magic.views import who as who_view

NOTEBOOKS = ("a.ipynb", "sub/b.ipynb")
TF_MIB, B_MIB = 2048, 512


class Setup:
    """The server, its two notebook kernels (id, pid), and a fake NVML placing them on GPUs."""

    def __init__(self, server: JupyterServer, kernels: dict[str, tuple[str, int]]) -> None:
        self.server = server
        self.kernels = kernels
        self.runtime_dir = server.env.runtime_dir

    def inventory(self, nvml: bool = True) -> Inventory:
        if not nvml:
            return Inventory(error="no NVML here")
        gpus = four_gpus()  # GPU 0: this process and OTHER_PID
        gpus[1].processes = [(self.kernels["a.ipynb"][1], TF_MIB)]
        gpus[2].processes = [(self.kernels["sub/b.ipynb"][1], B_MIB)]
        return read_inventory(Nvml(module=FakeNvml(gpus)))


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    with isolated_jupyter() as env, running_server(env) as server:
        kernels = {}
        for path in NOTEBOOKS:
            target = env.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nbformat.v4.new_notebook(), str(target))
            session = server.request("POST", "api/sessions", {"path": path, "name": path, "type": "notebook",
                                                              "kernel": {"name": "python3"}})
            kernel_id = session["kernel"]["id"]
            connection = server.connect(kernel_id)
            kernels[path] = (kernel_id, connection.pid())
            if path == "a.ipynb":
                connection.run("import tensorflow", timeout=180)
        yield Setup(server, kernels)


def _row(rows: list[holders.Holder], pid: int) -> holders.Holder:
    return next(row for row in rows if row.pid == pid)


def test_who_names_each_kernels_notebook_memory_and_tensorflow(setup: Setup) -> None:
    rows = holders.who(setup.inventory(), setup.runtime_dir)
    a_id, a_pid = setup.kernels["a.ipynb"]
    b_id, b_pid = setup.kernels["sub/b.ipynb"]
    a, b = _row(rows, a_pid), _row(rows, b_pid)
    assert (a.kernel_id, a.notebook, a.tensorflow, a.gpu_memory) == (a_id, "a.ipynb", True, {1: TF_MIB * MIB})
    assert (b.kernel_id, b.notebook, b.tensorflow, b.gpu_memory) == (b_id, "sub/b.ipynb", False, {2: B_MIB * MIB})
    for row in (a, b):
        assert row.user and not row.this and row.state == "idle"
        assert isinstance(row.idle_seconds, float) and 0 <= row.idle_seconds < 3600
    me = _row(rows, os.getpid())
    assert me.this and me.gpu_memory == {0: 1024 * MIB} and me.kernel_id is None and not me.is_kernel
    other = _row(rows, OTHER_PID)
    assert other.gpu_memory == {0: 19456 * MIB} and other.notebook is None and other.kernel_id is None


def test_the_public_form_is_a_plain_dict_of_its_own() -> None:
    """`Holder.as_dict()` (what `tfgpu_magic.who()` gives): every field by name, JSON-ready, and its
    `gpu_memory` a copy, so a caller editing it leaves the row as it was."""
    row = _fake_row()
    public = row.as_dict()
    assert json.loads(json.dumps(public)) == {**FAKE_FIELDS, "gpu_memory": {"0": 3 * 1024 * MIB}}
    public["gpu_memory"][1] = 0
    assert row.gpu_memory == {0: 3 * 1024 * MIB}


def test_inside_a_kernel_who_marks_that_kernel_and_names_its_notebook(setup: Setup) -> None:
    """Called from notebook a's own kernel (no NVML there): its row is `this`, with its notebook."""
    from servers import KernelConnection

    a_id, a_pid = setup.kernels["a.ipynb"]
    kernel: KernelConnection = setup.server.connect(a_id)
    try:
        row = kernel.evaluate(
            "[r for r in __import__('tfgpu_magic.holders').holders.who() if r.this][0].as_dict()", timeout=60)
        text = kernel.evaluate("__import__('tfgpu_magic.views.who').views.who.report()", timeout=60)
    finally:
        kernel.close()
    assert (row["pid"], row["kernel_id"], row["notebook"], row["tensorflow"]) == (a_pid, a_id, "a.ipynb", True)
    assert row["gpu_memory"] == {} and text.startswith(who_view.NO_NVML)
    assert any("a.ipynb" in line and line.endswith("← this kernel") for line in text.splitlines())
    assert setup.server.token not in text


def test_the_report_groups_by_gpu_and_never_shows_the_token(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = setup.inventory()
    rows = holders.who(inventory, setup.runtime_dir)
    text = who_view.render(rows, inventory)
    print(text)
    lines = text.splitlines()
    gpu1 = lines.index(next(line for line in lines if line.startswith("GPU 1 ")))
    assert "a.ipynb" in lines[gpu1 + 1] and "TensorFlow loaded" in lines[gpu1 + 1] and "2.0 GiB" in lines[gpu1 + 1]
    assert any("← this kernel" in line and f"pid {os.getpid()}" in line for line in lines)
    assert "sub/b.ipynb" in text and "no TensorFlow" in text and "GPU 3 " in text
    out = capsys.readouterr()
    for blob in (text, repr(rows), out.out, out.err, repr(sessions.my_servers(setup.runtime_dir))):
        assert setup.server.token not in blob


def test_without_nvml_this_users_kernels_are_still_listed(setup: Setup) -> None:
    inventory = setup.inventory(nvml=False)
    rows = holders.who(inventory, setup.runtime_dir)
    a = _row(rows, setup.kernels["a.ipynb"][1])
    assert a.gpu_memory == {} and a.notebook == "a.ipynb" and a.tensorflow is True
    text = who_view.render(rows, inventory)
    assert text.startswith(who_view.NO_NVML) and "a.ipynb" in text and "sub/b.ipynb" in text


def test_a_server_file_whose_pid_does_not_hold_the_port_gets_no_request(setup: Setup, tmp_path: Path) -> None:
    """A live process of this user (the real server) named with a port it does not hold: whatever
    listens there (a stale server's successor) gets nothing, token least of all."""
    secret = "s3cret-" + os.urandom(8).hex()
    with RecordingListener() as listener:
        write_server_file(tmp_path, setup.server.process.pid, listener.port, secret)
        assert sessions.my_servers(tmp_path) == [] and sessions.kernel_sessions(tmp_path) == {}
    assert listener.requests == []


def test_a_server_file_writable_by_others_is_not_trusted(setup: Setup, tmp_path: Path) -> None:
    source = next(setup.runtime_dir.glob("jpserver-*.json"))
    copy = tmp_path / source.name
    copy.write_bytes(source.read_bytes())
    copy.chmod(0o622)
    assert sessions.my_servers(tmp_path) == []
    copy.chmod(0o600)
    assert [s.pid for s in sessions.my_servers(tmp_path)] == [setup.server.process.pid]


def test_shutdown_needs_yes_and_goes_to_the_owning_server(setup: Setup) -> None:
    """Last in the module: it shuts down notebook b's kernel."""
    b_id, b_pid = setup.kernels["sub/b.ipynb"]
    with pytest.raises(PolicyError, match="--yes"):
        holders.shutdown(b_id, runtime_dir=setup.runtime_dir)
    assert b_id in [k["id"] for k in setup.server.kernels()]
    with pytest.raises(PolicyError, match="no Jupyter server of yours"):
        holders.shutdown("not-a-kernel", yes=True, runtime_dir=setup.runtime_dir)
    done = holders.shutdown(b_id, yes=True, runtime_dir=setup.runtime_dir)
    said = who_view.shutdown_text(done)
    assert done == holders.ShutDown(b_id, "sub/b.ipynb")
    assert said == f"Shut down kernel {b_id} (sub/b.ipynb)." and setup.server.token not in said
    assert b_id not in [k["id"] for k in setup.server.kernels()]
    wait_until(lambda: not processes.alive(b_pid) or None, 30, "kernel b gone")


# ----- the rendering's rules, on rows as `who` makes them ----------------------------------------
FAKE_FIELDS: dict[str, Any] = {
    "pid": 7, "user": "me", "kernel_id": "k-123", "notebook": "x.ipynb", "tensorflow": True,
    "gpu_memory": {0: 3 * 1024 * MIB}, "idle_seconds": 7200.0, "this": False, "state": "idle",
    "placed": None, "mine": True, "is_kernel": True, "host_pid": False, "tensorflow_figure": False,
    "frameworks": []}


def _fake_row(**changes: Any) -> holders.Holder:
    return holders.Holder(**{**FAKE_FIELDS, "gpu_memory": dict(FAKE_FIELDS["gpu_memory"]), **changes})


def test_an_idle_own_kernel_holding_a_gpu_gets_a_shutdown_hint_and_others_only_user_and_memory() -> None:
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    other = _fake_row(pid=8, user="bob", kernel_id=None, notebook=None, tensorflow=None, mine=False,
                      idle_seconds=None, state=None)
    text = who_view.render([_fake_row(), other], inventory)
    assert "Kernel k-123 (x.ipynb) is idle 2h00m" in text and "`%tfgpu who --shutdown k-123 --yes`" in text
    assert "  pid 8 · bob · 3.0 GiB" in text.splitlines()
    busy = who_view.render([_fake_row(state="busy", idle_seconds=None)], inventory)
    assert "--shutdown" not in busy and "busy" in busy


def test_host_pids_are_memory_only_and_the_fix_is_said_once() -> None:
    """Rows as `who` makes them in a container of its own pid namespace (tests/test_pid_namespace.py
    makes a real one): NVML's pids shown as host pids, this user's kernels apart, the fix once, and an
    idle kernel's hint although its memory is unknown."""
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    rows = [holders.host_row(31, {0: 5000 * MIB}), holders.host_row(31314, {0: 7000 * MIB, 1: None}),
            _fake_row(pid=31, gpu_memory={}), _fake_row(pid=40, kernel_id="k-here", gpu_memory={}, this=True)]
    text = who_view.render(rows, inventory)
    lines = text.splitlines()
    assert text.count(who_view.HOST_PIDS) == 1 and "docker run --pid=host" in text and "hostPID: true" in text
    gpu0 = lines.index(next(line for line in lines if line.startswith("GPU 0 ")))
    assert lines[gpu0 + 1:gpu0 + 3] == ["  host pid 31 · 4.9 GiB", "  host pid 31314 · 6.8 GiB"]
    assert "  host pid 31314 · memory unknown" in lines
    mine = lines.index("Your kernels (their TensorFlow reports no GPU memory):")
    assert lines[mine + 1].startswith("  pid 31 · me · x.ipynb") and lines[mine + 2].endswith("← this kernel")
    assert "Kernel k-123 (x.ipynb) is idle 2h00m" in text
    assert who_view.UNSEEN_PIDS.split("{")[0] not in text


def test_pids_nvml_lists_but_proc_does_not_show_get_a_hint_only() -> None:
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    gone = _fake_row(pid=31314, user=None, kernel_id=None, notebook=None, tensorflow=None, mine=False,
                     idle_seconds=None, state=None, is_kernel=False)
    text = who_view.render([gone, _fake_row()], inventory)
    assert "NVML lists pid 31314, which /proc here does not show: a process that has just ended" in text
    assert "  pid 31314 · ? · 3.0 GiB" in text.splitlines() and who_view.HOST_PIDS not in text
    assert "Your kernels on no GPU" not in text


def test_a_stale_reading_is_shown_with_its_warning_first() -> None:
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    stale = inventory._replace(stale_seconds=14.0, blocked_seconds=12.0, warning="the NVIDIA driver is not answering")
    assert who_view.render([_fake_row()], stale).splitlines()[:2] == [
        "Note: the NVIDIA driver is not answering.", who_view.render([_fake_row()], inventory).splitlines()[0]]


def test_a_shutdown_without_a_notebook_names_the_kernel_only() -> None:
    assert who_view.shutdown_text(holders.ShutDown("k-123", None)) == "Shut down kernel k-123."


# ----- /proc read as hostile --------------------------------------------------------------------
def _fake_proc(root: Path, pid: int, cmdline: bytes, maps: bytes | None, uid: int) -> Path:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(cmdline)
    (folder / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if maps is not None:
        (folder / "maps").write_bytes(maps)
    return root


@pytest.mark.parametrize(("argv", "kernel_id"), [
    ([b"python", b"-m", b"ipykernel_launcher", b"-f", b"/run/kernel-abc-1.json"], "abc-1"),
    ([b"python", b"-m", b"ipykernel_launcher", b"--f=/run/kernel-v2-77xyz.json"], "v2-77xyz"),
    ([b"python", b"-m", b"ipykernel_launcher", b"-f", b"/tmp/tmpab12cd.json"], None),
    ([b"python", b"tests/fake_gpu_kernel.py", b"-f", b"/run/kernel-abc.json"], "abc"),  # a kernelspec's wrapper
    ([b"conda", b"run", b"-n", b"tf", b"python", b"-m", b"ipykernel_launcher", b"-f", b"/run/kernel-c1.json"], "c1"),
])
def test_a_kernel_is_known_by_the_connection_file_its_command_line_names(
        tmp_path: Path, argv: list[bytes], kernel_id: str | None) -> None:
    proc = _fake_proc(tmp_path, 99, b"\0".join(argv) + b"\0", b"7f00 r-xp libc.so\n", os.getuid())
    info = processes.describe(99, proc)
    assert info.kernel_id == kernel_id and info.tensorflow is False and info.uid == os.getuid()


@pytest.mark.parametrize("argv", [
    [b"python", b"train.py", b"-f", b"data.csv"],
    [b"jq", b"-f", b"filter.jq", b"in.json"],
    [b"python", b"train.py", b"--epochs", b"3"],
])
def test_a_process_without_a_connection_file_is_no_kernel(tmp_path: Path, argv: list[bytes]) -> None:
    proc = _fake_proc(tmp_path, 98, b"\0".join(argv) + b"\0", None, os.getuid())
    assert processes.describe(98, proc).is_kernel is False and processes.my_kernels(proc) == []


def test_a_kernel_started_by_a_wrapper_is_this_kernel_in_who() -> None:
    """A kernelspec whose argv runs a wrapper script (tests/fake_gpu_kernel.py, as `conda run` or a
    custom kernelspec would) instead of `ipykernel`: `%tfgpu who` in that kernel marks its own row
    as this kernel, with its kernel id, not as "not a kernel"; seen from outside, it is a kernel too."""
    import fake_gpu_kernel
    from servers import standalone_kernel

    with isolated_jupyter("tfgpu-wrapper-") as env:
        fake_gpu_kernel.write_kernelspec(env.kernels_dir)
        with standalone_kernel(env, kernel_name=fake_gpu_kernel.KERNEL_NAME) as kernel:
            kernel.ok("%load_ext tfgpu_magic")
            pid = kernel.pid()
            shown = kernel.ok("%tfgpu who").stdout
            outside = {info.pid: info for info in processes.my_kernels()}
    mine = [line for line in shown.splitlines() if line.endswith("← this kernel")]
    assert len(mine) == 1 and f"pid {pid}" in mine[0], shown
    assert f"kernel {kernel.kernel_id[:8]}" in mine[0] and "not a kernel" not in mine[0]
    assert outside[pid].kernel_id == kernel.kernel_id


def test_proc_files_are_capped_and_a_fifo_is_not_waited_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _fake_proc(tmp_path, 5, b"x\0", b"a" * 4096 + b" /site-packages/tensorflow/libtensorflow_cc.so.2\n", 0)
    assert processes.tensorflow_loaded(5, proc) is True
    monkeypatch.setattr(processes, "MAPS_BYTES", 1024)
    assert processes.tensorflow_loaded(5, proc) is False  # the marker lies past the cap
    os.mkfifo(proc / "5" / "fifo")
    done = threading.Event()
    result: list[bytes | None] = []
    threading.Thread(target=lambda: (result.append(processes.read_capped(proc / "5" / "fifo", 10)), done.set()),
                     daemon=True).start()
    assert done.wait(5) and result == [b""]
    assert stat.S_ISFIFO(os.stat(proc / "5" / "fifo").st_mode)


def test_in_a_container_a_kernel_shows_the_memory_its_frameworks_publish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With NVML's pids the host's, a kernel of this user (found by its command line) is listed with what
    its published state says TensorFlow's tensors use, labelled so; NVML's pids stay host pids."""
    import subprocess
    import sys

    from tfgpu_magic.jupyter import kernelstate
    from tfgpu_magic.language.policy import Policy

    kernel_id = "7a0b1c2d-1111-4222-8333-444455556666"
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "ipykernel_launcher", "-f",
                                str(tmp_path / f"kernel-{kernel_id}.json")])
    try:
        wait_until(lambda: processes.runs_kernel(process.pid, kernel_id), 30, "the kernel's command line")
        inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
        record = {**kernelstate.STAMP, "kernel_id": kernel_id, "pid": process.pid, "written": 1.0,
                  "policy": kernelstate.policy_record(Policy()),
                  "tensorflow": {"state": "initialized", "cuda_started": True, "initialized_by": None,
                                 "memory": [{"device": "GPU:0", "card": inventory.gpus[3].uuid,
                                             "current": 3 * 1024 * MIB, "peak": 4 * 1024 * MIB}]},
                  "pending": [], "restart_needed": False, "keep": False,
                  "frameworks": {"jax": {"state": "started", "version": "0.10.2", "variables": [], "fractions": [],
                                         "memory": [{"device": "gpu:0", "card": inventory.gpus[3].uuid,
                                                     "current": 1024 * MIB, "peak": None, "reserved": None}]},
                                 "torch": None, "keras": None}}
        path = kernelstate.state_path(kernel_id, tmp_path)
        path.write_text(json.dumps(record))
        path.chmod(0o600)
        monkeypatch.setattr(processes, "foreign_pid_namespace", lambda: True)
        rows = holders.who(inventory, tmp_path)
        mine = _row(rows, process.pid)
        assert mine.gpu_memory == {3: 3 * 1024 * MIB} and mine.tensorflow_figure and not mine.host_pid
        assert all(row.host_pid for row in rows if row.pid == OTHER_PID)
        text = who_view.render(rows, inventory)
        assert f"pid {process.pid} · " in text and "3.0 GiB (TensorFlow's figure)" in text
        assert mine.frameworks == (("jax", 1024 * MIB),) and "JAX 1.0 GiB" in text  # JAX's own figure, as published
        assert text.count("docker run --pid=host") == 1
    finally:
        process.kill()
        process.wait(10)

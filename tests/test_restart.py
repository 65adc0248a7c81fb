"""`%tfgpu restart`, saved defaults, autoload and kernelspecs with real parts only.

A real `jupyter_server` (one per module, in temp dirs, token auth), real kernels, real TensorFlow
(CPU build). "split cpu N" gives N logical CPU devices only when set before TF initializes, so a
count of N in a new kernel's first TensorFlow cell proves the policy was in force before it.
Kernels here are never given `%load_ext` after a restart: the extension must come by itself.
Kernels without a server get connection files named as their real managers name them
(`servers.CONNECTION_NAMING`): a server's `kernel-<id>.json`, jupyter_client's and nbclient's temp
name, VS Code's.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from jupyter_client import BlockingKernelClient
from kernels import CellResult
from servers import (
    CONNECTION_NAMING,
    NO_RESTART_SCHEDULED,
    JupyterEnv,
    JupyterServer,
    KernelConnection,
    assert_kernel_kept,
    await_new_kernel,
    isolated_jupyter,
    pid_alive,
    processes_naming,
    restarting_kernel,
    running_server,
    standalone_kernel,
    stop_pids,
    wait_until,
)

from tfgpu_magic.jupyter import restart
from tfgpu_magic.errors import PolicyError

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]

CPU_COUNT = "import tensorflow as tf\nprint('logical CPUs:', len(tf.config.list_logical_devices('CPU')))"
EXTENSION_LOADED = "'tfgpu_magic' in get_ipython().extension_manager.loaded"
CPU_POLICY = "__import__('tfgpu_magic').current_policy().cpu_devices"
RESTARTING = "Restarting the kernel"
NOT_RESTARTED = "Not restarted"
RESTART_TIMEOUT = 60.0
CYCLES = int(os.environ.get("TFGPU_RESTART_CYCLES", "3"))
"""Restart cycles in a row: a few in `make test`, 50 under `make soak` (which also checks the time)."""
CYCLE_BUDGET = 12.0
"""Seconds one restart cycle may take on average under `make soak` (restart + re-apply + TensorFlow's
first import); `make test` checks only the policies, since shared machines vary."""
LOAD_ONCE = (
    "if 'tfgpu_magic' not in get_ipython().extension_manager.loaded:\n"
    "    get_ipython().run_line_magic('load_ext', 'tfgpu_magic')"
)
"""`%load_ext`, quiet when the extension already loaded at start (an earlier restart's startup file):
either way a warning found at load appears in this cell's output."""
POLICY_FORMAT = "tfgpu_magic/policy/1"
PENDING_FIELDS = {"format", "policy", "kernel_id", "created", "connection_file"}


@pytest.fixture(autouse=True)
def tensorflow_stays_out_of_pytest():
    """TensorFlow runs only in kernels."""
    yield
    assert "tensorflow" not in sys.modules


@pytest.fixture(scope="module")
def server():
    """One real Jupyter server for the module; a `python3-ext` kernelspec loads the extension at start."""
    with isolated_jupyter() as env:
        env.write_kernelspec("python3-ext", extra_argv=("--ext=tfgpu_magic",))
        with running_server(env) as running:
            yield running
        assert env.processes() == [], "a process of the test server outlived it"


# ----- helpers ----------------------------------------------------------------------------------
def logical_cpus(kernel: KernelConnection) -> int:
    """Import TensorFlow in `kernel` (the first TF cell there) and count its logical CPUs."""
    result = kernel.ok(CPU_COUNT)
    match = re.fullmatch(r"logical CPUs: (\d+)", result.stdout.strip())
    assert match, result.output
    return int(match.group(1))


def pending_file(env: JupyterEnv, kernel: KernelConnection | str) -> Path:
    """The pending file of `kernel` (or of the server kernel id `kernel`), asked from the kernel
    itself where its connection file is not a server's."""
    if isinstance(kernel, str):
        return env.runtime_dir / f"tfgpu-pending-{kernel}.json"
    if kernel.connection_file.name.startswith("kernel-"):
        return pending_file(env, kernel.kernel_id)
    return Path(kernel.evaluate(PENDING_PATH))


PENDING_PATH = (
    "str(__import__('tfgpu_magic.jupyter.persist').jupyter.persist.pending_path("
    "__import__('tfgpu_magic.jupyter.startup').jupyter.startup.current_kernel_key(get_ipython())))"
)

def restart_into_policy(kernel: KernelConnection, cell: str) -> tuple[KernelConnection, str]:
    """Run `cell` (which restarts the kernel) and `await_reapplied`; the new kernel and the cell's output."""
    old_pid = kernel.pid()
    output = kernel.ok(cell).output
    return await_reapplied(kernel, old_pid), output


def await_reapplied(kernel: KernelConnection, old_pid: int) -> KernelConnection:
    """Wait for the new kernel (another PID) to take the pending policy and have the extension
    loaded, by itself; return it."""
    path = pending_file(kernel.env, kernel.kernel_id)
    return await_taken(kernel, old_pid, path)


def await_taken(kernel: KernelConnection, old_pid: int, path: Path) -> KernelConnection:
    """`await_reapplied` for the pending file `path`."""
    wait_until(lambda: not path.exists(), RESTART_TIMEOUT, f"{path.name} taken by the new kernel", interval=0.02)
    new = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
    assert new.pid() != old_pid
    wait_until(lambda: new.evaluate(EXTENSION_LOADED, timeout=10), 10, "tfgpu_magic loaded again", interval=0.5)
    return new


# ----- the labextension's restart command, named where the front end has it -------------------
@pytest.mark.parametrize(("name", "installed", "named"), [
    ("kernel-0f1e2d3c-aaaa-bbbb-cccc-000000000001.json", True, True),
    ("kernel-0f1e2d3c-aaaa-bbbb-cccc-000000000001.json", False, False),
    ("tmp8x_u2k0q.json", True, False),  # nbclient, papermill: no JupyterLab in front
])
def test_the_restart_command_is_named_only_for_a_servers_kernel_with_the_extension(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, installed: bool, named: bool):
    import ipykernel.connect
    import jupyter_core.paths
    from types import SimpleNamespace

    from tfgpu_magic.views.status import RESTART_HINT, restart_hint

    labextensions = tmp_path / "labextensions"
    if installed:
        (labextensions / restart.LABEXTENSION).mkdir(parents=True)
        (labextensions / restart.LABEXTENSION / "package.json").write_text("{}")
    monkeypatch.setattr(jupyter_core.paths, "jupyter_path", lambda *parts: [str(tmp_path / Path(*parts))])
    monkeypatch.setattr(ipykernel.connect, "get_connection_file", lambda: str(tmp_path / name))
    kernel_shell = SimpleNamespace(kernel=object())
    hint = restart_hint(kernel_shell)
    assert hint.startswith(RESTART_HINT)
    assert (restart.RESTART_COMMAND in hint) is named, hint
    assert restart.RESTART_COMMAND not in restart_hint(SimpleNamespace(kernel=None))


def test_a_servers_kernel_offers_the_command_in_restart_and_in_the_locked_message(server: JupyterServer):
    if not restart.labextension_installed():
        pytest.skip("the labextension is not installed in this environment (make test links it)")
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\nimport tensorflow as tf\ntf.constant(1)")
        locked = kernel.ok("%tfgpu split cpu 3").output
        offer = kernel.ok("%tfgpu restart").output
    assert restart.RESTART_COMMAND in locked, locked
    assert restart.RESTART_COMMAND in offer, offer


# ----- (a) the server route ---------------------------------------------------------------------
def test_server_restart_applies_policy_in_new_kernel(server: JupyterServer):
    """TF initialized, another policy, `restart --yes`: the server's new kernel has it in force on
    its first TF import, no `%load_ext` run by us, and the pending file is gone."""
    with server.kernel() as kernel:
        assert logical_cpus(kernel) == 1
        recorded = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 3")
        assert "cannot change now" in recorded.stdout
        new, output = restart_into_policy(kernel, "%tfgpu restart --yes")
        assert RESTARTING in output
        assert not pending_file(server.env, kernel.kernel_id).exists()
        loaded = new.evaluate("sorted(m for m in __import__('sys').modules if m.startswith('tfgpu_magic'))")
        assert "tfgpu_magic.controller" in loaded and not set(NOT_LOADED_FOR_A_PENDING_POLICY) & set(loaded), loaded
        assert logical_cpus(new) == 3
        assert new.evaluate(CPU_POLICY) == 3


NOT_LOADED_FOR_A_PENDING_POLICY = ("tfgpu_magic.language.grammar", "tfgpu_magic.views.status",
                                   "tfgpu_magic.views.actions", "tfgpu_magic.jupyter.restart")
"""Not needed to apply a stored policy, so the new kernel does not load them before its first cell
(the user waits for that load; `make bench`'s restart figure)."""


# ----- (b) an autorestarting manager, no server -------------------------------------------------
@pytest.mark.parametrize("naming", sorted(CONNECTION_NAMING))
def test_exit_route_under_autorestarting_manager(server: JupyterServer, naming: str):
    """No server owns the kernel, TFGPU_MAGIC_RESTART=exit, whatever its connection file is called:
    the kernel exits, its manager restarts it on the same file, and the policy is in force in the
    new kernel before its first cell."""
    extra = {"TFGPU_MAGIC_RESTART": "exit"}
    with restarting_kernel(server.env, extra, time_to_dead=0.5, naming=naming) as (manager, kernel):
        assert logical_cpus(kernel) == 1
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2")
        path = pending_file(server.env, kernel)
        old_pid = kernel.pid()
        output = kernel.ok("%tfgpu restart --yes").output
        assert RESTARTING in output and "terminal" not in output, output
        new = await_taken(kernel, old_pid, path)
        assert manager.restarts == 1
        assert not path.exists()
        assert logical_cpus(new) == 2


# ----- (c) no restart unless asked, and never one that nothing brings back ----------------------
def test_restart_without_yes_restarts_nothing(server: JupyterServer):
    """Without `--yes` the kernel stays (same PID), the output points to `--yes`, nothing is stored."""
    with server.kernel() as kernel:
        pid = kernel.pid()
        result = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart")
        assert "--yes" in result.stdout
        assert any("Button" in shown or "VBox" in shown for shown in result.results), result.output
        assert_kernel_kept(kernel, pid)
        assert not pending_file(server.env, kernel.kernel_id).exists()


@pytest.mark.parametrize("naming", sorted(CONNECTION_NAMING))
def test_plain_kernel_is_never_killed_and_takes_the_policy_when_restarted(server: JupyterServer, naming: str):
    """A kernel without a server and without TFGPU_MAGIC_RESTART (nbclient-like; a server runs in
    the same runtime dir but does not own it), its connection file named as jupyter_client, nbclient
    or VS Code name it: `restart --yes` keeps it, says in two lines to restart from the front end
    (never "terminal IPython"), and stores the policy (0600). After the front end's restart
    (`KernelManager.restart_kernel`) the policy is in force before the first cell, no `%load_ext`."""
    with standalone_kernel(server.env, naming=naming) as kernel:
        pid = kernel.pid()
        result = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes")
        said = result.stdout[result.stdout.find(NOT_RESTARTED) :].splitlines()
        assert said[0].startswith(NOT_RESTARTED) and len(said) == 2 and "front end" in said[1], result.output
        assert RESTARTING not in result.output and "terminal" not in result.output
        assert_kernel_kept(kernel, pid)
        stored = pending_file(server.env, kernel)
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        content = json.loads(stored.read_text())
        assert set(content) == PENDING_FIELDS and content["policy"]["cpu_devices"] == 2
        assert content["connection_file"] == str(kernel.connection_file.resolve())
        kernel.manager.restart_kernel(now=False)
        new = await_taken(kernel, pid, stored)
        try:
            assert logical_cpus(new) == 2
        finally:
            new.close()


SLOW_RESTART_REQUEST = """
import time
from tfgpu_magic.jupyter import server
_request = server.Server.request
def _slow(self, method, path, _request=_request):
    if method == "POST":
        time.sleep(1.0)
    return _request(self, method, path)
server.Server.request = _slow
"""
"""In the kernel: the restart request goes out a second late, so the queued cells surely reach the old
kernel before it ends (without it, a fast restart may end it first, and their requests go with it)."""


@pytest.mark.parametrize("request_delay", ["none", "1 s"])
def test_cells_queued_behind_the_restart_never_run_in_the_old_kernel(server: JupyterServer, request_delay: str):
    """Run All over `%tfgpu restart --yes` and three cells: each queued cell is answered `aborted` by the
    old kernel, or is never run (the old kernel ended with it unread), or runs in the new one with the
    policy in force; none runs in the old kernel. With the request a second late, the old kernel
    answers all three `aborted`."""
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 3")
        if request_delay != "none":
            kernel.ok(SLOW_RESTART_REQUEST)
        old_pid = kernel.pid()
        client = kernel.client
        restart_id = client.execute("%tfgpu restart --yes")
        probe = "import os; print(os.getpid(), __import__('tfgpu_magic').current_policy().cpu_devices)"
        queued = [client.execute(probe) for _ in range(3)]
        outcomes: dict[str, str] = {}
        printed: dict[str, str] = {}
        deadline = time.monotonic() + RESTART_TIMEOUT
        while len(outcomes) < 4 and time.monotonic() < deadline:
            try:
                msg = client.get_shell_msg(timeout=0.5)
            except queue.Empty:
                if not pid_alive(old_pid) and restart_id in outcomes:
                    break  # the old kernel is gone: what it did not answer was never run there
                continue
            outcomes[msg["parent_header"]["msg_id"]] = msg["content"]["status"]
        while True:
            try:
                msg = client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                break
            if msg["msg_type"] == "stream":
                printed[msg["parent_header"].get("msg_id", "")] = msg["content"]["text"]
        assert outcomes.get(restart_id) == "ok", outcomes
        for msg_id in queued:
            if outcomes.get(msg_id) == "ok":  # reached the new kernel: policy in force there
                pid, cpus = printed[msg_id].split()
                assert int(pid) != old_pid and cpus == "3", printed[msg_id]
            else:
                assert outcomes.get(msg_id) in ("aborted", None), outcomes
                assert str(old_pid) not in printed.get(msg_id, ""), printed
        if request_delay != "none":
            assert [outcomes.get(msg_id) for msg_id in queued] == ["aborted"] * 3, outcomes
        new = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
        assert new.evaluate(CPU_POLICY) == 3
        new.close()


def test_cells_run_again_when_the_server_refuses_the_restart(server: JupyterServer, monkeypatch: pytest.MonkeyPatch):
    """If the restart request fails, the held queue is released: the next cell runs in the same kernel
    and says the kernel was not restarted."""
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2")
        old_pid = kernel.pid()
        kernel.ok(
            "import tfgpu_magic.jupyter.restart as r\n"
            "r.Server.request = lambda self, method, path: (_ for _ in ()).throw(OSError('refused by test'))\n"
            "r.find_server = lambda kernel_id, runtime_dir=None: r.Server('http://127.0.0.1:9/', '', 1)"
        )
        kernel.ok("%tfgpu restart --yes")
        wait_until(lambda: kernel.run("1").status == "ok", 10, "the queue released", interval=0.2)
        result = kernel.ok("import os; print(os.getpid())")
        assert int(result.stdout.split()[-1]) == old_pid


def test_nbclient_restart_takes_the_policy(server: JupyterServer):
    """A real nbclient `NotebookClient` (its own temp connection file): `restart --yes` in one cell
    stores the policy; after nbclient's `km.restart_kernel()` the next cell has it in force, the
    extension loaded by itself."""
    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    cells = ["%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes", f"print({EXTENSION_LOADED}, {CPU_POLICY})"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell) for cell in cells])
    client = NotebookClient(notebook, kernel_name="python3", timeout=int(RESTART_TIMEOUT))
    client.km = client.create_kernel_manager()
    client.km.kernel_spec_manager = server.env.kernelspec_manager()
    with open(server.env.root / "nbclient-kernel.log", "ab") as log:
        try:
            with client.setup_kernel(env=server.env.environ, cwd=str(server.env.root), stdout=log, stderr=log):
                assert Path(client.km.connection_file).name.startswith("tmp")
                client.execute_cell(notebook.cells[0], 0)
                assert NOT_RESTARTED in notebook.cells[0].outputs[0]["text"]
                run_sync(client.km.restart_kernel)()
                run_sync(client.kc.wait_for_ready)(timeout=RESTART_TIMEOUT)
                client.execute_cell(notebook.cells[1], 1)
                assert notebook.cells[1].outputs[0]["text"] == "True 2\n", notebook.cells[1].outputs
        finally:
            if client.km is not None and client.km.connection_file:
                stop_pids(processes_naming(client.km.connection_file))


def test_restart_without_yes_where_nothing_restarts_shows_no_button(server: JupyterServer):
    """Without a server or the exit route, `%tfgpu restart` shows no button (pressing it would not
    restart anything) and says exactly what to do; nothing is stored, the kernel stays."""
    with standalone_kernel(server.env, naming="temp") as kernel:
        pid = kernel.pid()
        result = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart")
        assert not result.results, result.output
        assert "%tfgpu restart --yes" in result.stdout and "front end" in result.stdout, result.output
        assert "Click" not in result.stdout and "terminal" not in result.stdout
        assert_kernel_kept(kernel, pid)
        assert not pending_file(server.env, kernel).exists()


def test_terminal_ipython_is_named_only_there(shell, capsys):
    """In terminal IPython (no kernel) `restart`, with or without --yes, says it is terminal IPython
    and stores nothing."""
    for line in ("restart --yes", "restart"):
        shell.run_line_magic("tfgpu", line)
        out = capsys.readouterr().out
        assert out.startswith(NOT_RESTARTED) and "terminal IPython" in out, out


def test_no_restart_scheduled_probe_names_the_real_thread():
    """The probe `assert_kernel_kept` runs in kernels watches the thread `restart` really starts."""
    assert repr(restart.RESTART_THREAD) in NO_RESTART_SCHEDULED


# ----- (d) many restarts in a row ---------------------------------------------------------------
def test_restart_cycles_alternating_policy(server: JupyterServer):
    """`CYCLES` restarts of one kernel, the policy alternating between split cpu 2 and 3: every new
    kernel has the right one in force; under `make soak`, a cycle stays within `CYCLE_BUDGET` seconds
    on average."""
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        counts = []
        started = time.monotonic()
        for cycle in range(CYCLES):
            wanted = 2 + cycle % 2
            kernel, _ = restart_into_policy(kernel, f"%tfgpu split cpu {wanted}\n%tfgpu restart --yes")
            counts.append((wanted, logical_cpus(kernel)))
        elapsed = time.monotonic() - started
        assert counts == [(2 + cycle % 2,) * 2 for cycle in range(CYCLES)]
        if "TFGPU_RESTART_CYCLES" in os.environ:
            assert elapsed / CYCLES < CYCLE_BUDGET, f"{elapsed:.1f} s for {CYCLES} cycles"
        print(f"{CYCLES} restart cycles: {elapsed:.1f} s, {elapsed / CYCLES:.2f} s each")


# ----- (e) two kernels, one server --------------------------------------------------------------
def test_two_kernels_restarted_side_by_side_keep_their_own_policy(server: JupyterServer):
    """Two kernels of one server with different policies, restarted at the same time: each new
    kernel has its own policy."""
    with server.kernel() as first, server.kernel() as second:
        pids = {first.kernel_id: first.pid(), second.kernel_id: second.pid()}
        for kernel, count in ((first, 2), (second, 3)):
            cell = f"%load_ext tfgpu_magic\n%tfgpu split cpu {count}\n%tfgpu restart --yes"
            assert RESTARTING in kernel.ok(cell).stdout
        renewed = {kernel.kernel_id: await_reapplied(kernel, pids[kernel.kernel_id]) for kernel in (first, second)}
        assert logical_cpus(renewed[first.kernel_id]) == 2
        assert logical_cpus(renewed[second.kernel_id]) == 3


# ----- the first cell of the new kernel, even with other clients busy ------------------------------
@contextlib.contextmanager
def steady_iopub_traffic(connection_file: Path, interval: float = 0.01) -> Iterator[None]:
    """A second client sending a silent no-op every `interval` s, so the kernel's IOPub channel
    (status busy/idle, seen by every client) never stays quiet for 0.2 s."""
    client = BlockingKernelClient(connection_file=str(connection_file))
    client.load_connection_file()
    client.start_channels(hb=False)
    stop = threading.Event()

    def send() -> None:
        while not stop.wait(interval):
            client.execute("pass", silent=True, store_history=False)

    sender = threading.Thread(target=send, name="steady-iopub", daemon=True)
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join(5)
        client.stop_channels()


def test_first_cell_after_restart_has_the_policy_even_under_traffic(server: JupyterServer):
    """The first cell that reaches the new kernel, sent the moment it answers, while another client
    keeps it busy with tiny requests (a polling front end), already sees the policy: the pending
    policy is taken at kernel start, before any request is served."""
    with server.kernel() as kernel:
        old_pid = kernel.pid()
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu restart --yes")
        path = pending_file(server.env, kernel.kernel_id)
        new = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
        try:
            with steady_iopub_traffic(new.connection_file):
                first = new.evaluate(CPU_POLICY)
            assert first == 2 and not path.exists()
            assert new.evaluate(EXTENSION_LOADED)
        finally:
            new.close()


# ----- (f) unusable pending files and runtime dirs ----------------------------------------------
def _corrupt(path: Path) -> str:
    path.write_text("{garbage", encoding="utf-8")
    path.chmod(0o600)
    return "is not valid JSON"


def _foreign(path: Path) -> str:
    path.write_text(json.dumps({"format": "someone-else/7", "policy": {"cpu_devices": 2}}), encoding="utf-8")
    path.chmod(0o600)
    return "not a tfgpu_magic policy file"


def _other_user(path: Path) -> str:
    path.write_text(json.dumps({"format": POLICY_FORMAT, "policy": {"cpu_devices": 2}}), encoding="utf-8")
    os.chown(path, 65534, 65534)
    return "belongs to another user"


BAD_PENDING = {"corrupt": _corrupt, "foreign": _foreign, "other-user": _other_user}


@dataclass
class BadPendingLoad:
    """A kernel restarted by the server while an unusable pending file waited for it, then given
    `%load_ext tfgpu_magic`."""

    case: str
    path: Path
    content: bytes
    reason: str
    """What the warning must say."""
    result: CellResult
    """The `%load_ext` cell."""
    kernel: KernelConnection


@pytest.fixture(params=sorted(BAD_PENDING))
def load_with_bad_pending(request, server: JupyterServer):
    """A `BadPendingLoad` for each kind of unusable pending file; the file is removed afterwards."""
    if request.param == "other-user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    with server.kernel() as kernel:
        path = pending_file(server.env, kernel.kernel_id)
        try:
            reason = BAD_PENDING[request.param](path)
            content = path.read_bytes()
            old_pid = kernel.pid()
            server.restart_kernel(kernel.kernel_id)
            kernel = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
            yield BadPendingLoad(request.param, path, content, reason, kernel.run(LOAD_ONCE), kernel)
        finally:
            path.unlink(missing_ok=True)


def test_unusable_pending_file_is_a_warning_not_a_failure(load_with_bad_pending: BadPendingLoad):
    """The kernel starts, `%load_ext` succeeds with one warning line naming the file and the reason,
    no traceback, and the magic works afterwards; another user's file is left untouched."""
    loaded = load_with_bad_pending
    assert loaded.result.status == "ok" and not loaded.result.errors, loaded.result.output
    assert "Traceback" not in loaded.result.output
    lines = [line for line in loaded.result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfgpu_magic: ignoring the pending policy: "), lines
    assert loaded.reason in lines[0] and loaded.path.name in lines[0]
    assert loaded.kernel.evaluate(EXTENSION_LOADED)
    assert "Recorded" in loaded.kernel.ok("%tfgpu split cpu 2").stdout
    if loaded.case == "other-user":
        assert loaded.path.stat().st_uid == 65534 and loaded.path.read_bytes() == loaded.content


@pytest.fixture
def ext_kernel_after_corrupt_pending(server: JupyterServer):
    """A kernel whose kernelspec loads the extension at start (`--ext`), restarted by the server
    while a corrupt pending file waited for it: (kernel, the output of its first cell)."""
    with server.kernel("python3-ext") as kernel:
        assert kernel.evaluate(EXTENSION_LOADED)
        old_pid = kernel.pid()
        path = pending_file(server.env, kernel.kernel_id)
        _corrupt(path)
        try:
            server.restart_kernel(kernel.kernel_id)
            kernel = await_new_kernel(kernel, old_pid, RESTART_TIMEOUT)
            yield kernel, kernel.ok("%tfgpu split cpu 2").output
        finally:
            path.unlink(missing_ok=True)


def test_extension_loaded_at_start_survives_corrupt_pending_file(ext_kernel_after_corrupt_pending):
    """That kernel starts, with the extension loaded and `%tfgpu` working."""
    kernel, first_output = ext_kernel_after_corrupt_pending
    assert kernel.evaluate(EXTENSION_LOADED)
    assert "Recorded" in first_output and "Traceback" not in first_output


def test_startup_warning_reaches_the_user(ext_kernel_after_corrupt_pending, server: JupyterServer):
    """The warning about the corrupt pending file, found while the kernel started (nobody listening
    yet), is shown at the start of the first cell."""
    kernel, first_output = ext_kernel_after_corrupt_pending
    warning = f"tfgpu_magic: ignoring the pending policy: {pending_file(server.env, kernel.kernel_id)} is not valid JSON"
    assert warning in first_output


def test_unusable_runtime_dir_at_persist_level(tmp_path: Path, capsys):
    """A runtime dir that is a file: storing raises OSError (which `restart` reports), taking is a
    one-line PolicyError (shown as a warning at load); a missing runtime dir is silently no policy."""
    from tfgpu_magic.jupyter import persist
    from tfgpu_magic.language.policy import Policy

    not_a_dir = tmp_path / "runtime"
    not_a_dir.write_text("a file, not a directory")
    with pytest.raises(OSError):
        persist.store_pending("k1", Policy(cpu_devices=2), directory=not_a_dir)
    with pytest.raises(PolicyError) as info:
        persist.take_pending("k1", directory=not_a_dir)
    assert str(not_a_dir) in str(info.value) and "\n" not in str(info.value)
    assert persist.take_pending("k1", directory=tmp_path / "missing") is None
    assert capsys.readouterr().err == ""


def test_policy_files_are_private_whatever_the_umask(tmp_path: Path):
    """Pending and default policy files are mode 0600 even under umask 000."""
    from tfgpu_magic.jupyter import persist
    from tfgpu_magic.language.policy import Policy

    old_umask = os.umask(0)
    try:
        written = [
            persist.store_pending("k1", Policy(cpu_devices=2), directory=tmp_path),
            persist.default_path(tmp_path),
        ]
        persist.write_policy(written[1], Policy(cpu_devices=3))
    finally:
        os.umask(old_umask)
    assert [stat.S_IMODE(path.stat().st_mode) for path in written] == [0o600, 0o600]
    assert persist.take_pending("k1", directory=tmp_path) == Policy(cpu_devices=2)
    assert not written[0].exists()


# ----- (g) kernelspec ---------------------------------------------------------------------------
def test_kernelspec_starts_kernels_with_policy(server: JupyterServer):
    """`kernelspec tfgpu-test` lands in the isolated JUPYTER_DATA_DIR, the server starts a kernel
    from it whose first TF cell has the policy in force, and `--remove` takes it away."""
    spec_dir = server.env.kernels_dir / "tfgpu-test"
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 3")
        installed = kernel.ok('%tfgpu kernelspec tfgpu-test --display-name "TF test"')
        assert "Installed kernelspec 'tfgpu-test'" in installed.stdout
        spec = json.loads((spec_dir / "kernel.json").read_text())
        assert spec["display_name"] == "TF test" and spec["argv"][0] == sys.executable
        assert server.kernelspecs()["tfgpu-test"]["spec"]["display_name"] == "TF test"
        with server.kernel("tfgpu-test") as from_spec:
            assert logical_cpus(from_spec) == 3
            assert from_spec.evaluate(EXTENSION_LOADED)
        assert "Removed kernelspec 'tfgpu-test'" in kernel.ok("%tfgpu kernelspec tfgpu-test --remove").stdout
    assert not spec_dir.exists()
    assert "tfgpu-test" not in server.kernelspecs()


# ----- (h) saved default and autoload (own profile, kernels without a server) -------------------
@pytest.fixture(scope="module")
def profile_kernel():
    """An env of its own (its IPython profile gets a default and a startup file) and a kernel in it
    that saved `split cpu 2` as the default policy."""
    with isolated_jupyter("tfgpu-profile-") as env, standalone_kernel(env) as kernel:
        saved = kernel.ok("%load_ext tfgpu_magic\n%tfgpu split cpu 2\n%tfgpu default save")
        assert "Saved" in saved.stdout
        yield env, kernel


def test_default_save_reaches_new_kernels_that_load_the_extension(profile_kernel):
    """The default is a 0600 JSON file in the profile; a brand-new kernel gets it with `%load_ext`."""
    env, kernel = profile_kernel
    saved = env.profile_dir / "tfgpu_magic_default.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert json.loads(saved.read_text())["policy"]["cpu_devices"] == 2
    assert "split cpu into 2 logical devices" in kernel.ok("%tfgpu default show").stdout
    with standalone_kernel(env) as fresh:
        fresh.ok("%load_ext tfgpu_magic")
        assert logical_cpus(fresh) == 2


def test_autoload_on_loads_extension_and_policy_off_removes_only_ours(profile_kernel):
    """`autoload on`: a brand-new kernel has the extension and the default policy in force before
    any cell of ours; `autoload off` removes our startup file and leaves the others."""
    env, kernel = profile_kernel
    startup = env.profile_dir / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    other = startup / "00-other.py"
    other.write_text("OTHER_STARTUP = True\n")
    before = set(startup.iterdir())
    kernel.ok("%tfgpu autoload on")
    assert len(set(startup.iterdir()) - before) == 1
    with standalone_kernel(env) as fresh:
        first = fresh.ok(CPU_COUNT + f"\nprint({EXTENSION_LOADED}, OTHER_STARTUP)")
        assert first.stdout.split() == ["logical", "CPUs:", "2", "True", "True"]
    kernel.ok("%tfgpu autoload off")
    assert set(startup.iterdir()) == before
    with standalone_kernel(env) as fresh:
        assert fresh.evaluate(EXTENSION_LOADED) is False


# ----- (i) the server's token stays secret ------------------------------------------------------
SNAPSHOT_PENDING = """\
import glob as _glob, os as _os, shutil as _shutil
for _path in _glob.glob(_os.path.join(_os.environ["JUPYTER_RUNTIME_DIR"], "tfgpu-pending-*")):
    _shutil.copy(_path, {target!r})
"""


def test_token_never_leaks(server: JupyterServer, tmp_path: Path):
    """Whatever the kernels printed in this module, our pending files (copied while they exist), and
    the server's log (where kernels' own stderr goes) never contain the server's token."""
    with server.kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic\n%tfgpu\n%tfgpu split cpu 2\n%tfgpu restart\n%tfgpu export")
        new, _ = restart_into_policy(kernel, "%tfgpu restart --yes\n" + SNAPSHOT_PENDING.format(target=str(tmp_path)))
        new.ok("%tfgpu")
    snapshots = list(tmp_path.glob("tfgpu-pending-*"))
    ours = tmp_path / pending_file(server.env, kernel.kernel_id).name
    assert ours in snapshots and set(json.loads(ours.read_text())) == PENDING_FIELDS
    for path in [*snapshots, *server.env.runtime_dir.glob("tfgpu-pending-*")]:
        assert server.token not in path.read_text(errors="replace")
    assert server.env.transcript and not any(server.token in output for output in server.env.transcript)
    assert server.token not in server.log.read_text(errors="replace")

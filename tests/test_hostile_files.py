"""Files read as hostile: whatever sits at a policy or server-file path, the kernel starts.

Each hostile thing (a FIFO nobody writes to, a link to `/dev/zero`, JSON nested 30,000 deep, a
JSON list, a file others may write, a file over the size cap) is put at each path this project
reads: the pending policy, the saved default, a `jpserver-*.json`, and the kernelspec's policy
variable. Every case must give exactly one warning line naming the file, within seconds, and leave
the file as it was. The kernel cases load the extension the way `%load_ext` does, in a real kernel.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from faults_support import bounded
from servers import KernelConnection, isolated_jupyter, standalone_kernel, wait_until, write_server_file

from tfgpu_magic.jupyter import persist, server as server_client, startup
from tfgpu_magic import safefile
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.language.policy import Policy

DEEP = "[" * 30_000 + "]" * 30_000
"""Nested far beyond Python's recursion limit, yet under every size cap (60 KB)."""
READ_BOUND = 5.0
"""Seconds any one hostile read may take (a FIFO would block forever, /dev/zero until memory runs out)."""


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _deep(path: Path) -> None:
    _private(path, DEEP)


def _json_list(path: Path) -> None:
    _private(path, "[]")


def _world_writable(path: Path) -> None:
    _private(path, json.dumps({"format": persist.FORMAT, "policy": {"cpu_devices": 2}}))
    path.chmod(0o666)


def _huge(path: Path) -> None:
    _private(path, " " * (safefile.POLICY_BYTES + 1) + "{}")


def _private(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo, "dev-zero": _dev_zero, "deep": _deep, "list": _json_list, "world-writable": _world_writable,
    "huge": _huge,
}  # fmt: skip


def snapshot(path: Path) -> tuple[Any, ...]:
    """What must not change: the kind of thing at `path`, its mode, and (for a regular file) its bytes."""
    info = path.lstat()
    content = path.read_bytes() if stat.S_ISREG(info.st_mode) else os.readlink(path) if path.is_symlink() else None
    return stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), content


# ----- policy files, at the persist level -----------------------------------------------------------
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_policy_file_is_one_error_naming_it(tmp_path: Path, case: str):
    """`read_policy` on each hostile thing: one-line `PolicyError` naming the file, quickly, nothing changed."""
    path = tmp_path / "policy.json"
    HOSTILE[case](path)
    before = snapshot(path)
    with pytest.raises(PolicyError) as info:
        bounded(lambda: persist.read_policy(path), READ_BOUND)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and len(message) < 300, message
    assert snapshot(path) == before


def test_kernelspec_policy_variable_nested_deeply_is_one_error():
    """The kernelspec's `TFGPU_MAGIC_POLICY` holding JSON nested 30,000 deep: one `PolicyError`."""
    with pytest.raises(PolicyError) as info:
        startup.policy_from_env({startup.POLICY_ENV: DEEP})
    assert startup.POLICY_ENV in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(PolicyError):
        startup.policy_from_env({startup.POLICY_ENV: "[]"})


def test_missing_runtime_dir_is_created_private(tmp_path: Path):
    """Storing a pending policy creates a missing runtime dir with mode 0700, whatever the umask."""
    runtime = tmp_path / "a" / "runtime"
    old = os.umask(0o022)
    try:
        persist.store_pending("k1", Policy(cpu_devices=2), directory=runtime)
    finally:
        os.umask(old)
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700


# ----- jpserver files and server replies ---------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_server_file_is_one_warning(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]):
    """Each hostile thing as a `jpserver-*.json`: no server, one warning line naming the file, quickly."""
    path = tmp_path / "jpserver-4242.json"
    HOSTILE[case](path)
    before = snapshot(path)
    assert bounded(lambda: server_client.find_server("k1", tmp_path), READ_BOUND) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and path.name in lines[0] and "Traceback" not in lines[0], lines
    assert snapshot(path) == before


def test_server_reply_nested_deeply_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    """The owning server answering with JSON nested 30,000 deep, or a megabyte and more: one warning, no server.
    This test process, which holds the listener, stands in for the server that started the kernel."""
    from servers import RecordingListener

    monkeypatch.setattr(server_client, "ancestors", lambda: [os.getpid()])
    for body in (DEEP.encode(), b" " * (server_client.REPLY_BYTES + 10)):
        with RecordingListener(lambda method, path, body=body: (200, {}, body)) as owner:
            write_server_file(tmp_path, os.getpid(), owner.port, token="t")
            assert server_client.find_server("k1", tmp_path) is None
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "did not confirm" in lines[0], lines


# ----- the pending startup file is never written through a link or over a stranger's file ------------
def test_pending_startup_file_not_written_through_a_dangling_link(tmp_path: Path):
    """A dangling link where the startup file goes: refused, the link's target is not created."""
    link = persist.startup_path(tmp_path, persist.PENDING_STARTUP_NAME)
    link.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere.py"
    link.symlink_to(target)
    with pytest.raises(PolicyError, match="symbolic link"):
        persist.set_pending_startup(tmp_path)
    assert not target.exists() and link.is_symlink()


def test_pending_startup_file_not_written_over_a_stranger(tmp_path: Path):
    """A file of the same name that tfgpu_magic did not write is left exactly as it is."""
    path = persist.startup_path(tmp_path, persist.PENDING_STARTUP_NAME)
    path.parent.mkdir(parents=True)
    path.write_text("print('mine')\n")
    with pytest.raises(PolicyError, match="not written by tfgpu_magic"):
        persist.set_pending_startup(tmp_path)
    assert path.read_text() == "print('mine')\n"


# ----- `%tfgpu default save` never replaces a file tfgpu_magic did not write -----------------------------
def _sparse(path: Path) -> None:
    """2 GB of nothing: a size no policy file of ours has (sparse, so it costs no disk)."""
    with open(path, "wb") as file:
        file.truncate(2 << 30)
    path.chmod(0o600)


def _foreign(path: Path) -> None:
    """A file in our format, mode 0600, that belongs to another user (needs root to make)."""
    if os.geteuid() != 0:
        pytest.skip("making another user's file needs root")
    _private(path, json.dumps({"format": persist.FORMAT, "policy": {"cpu_devices": 2}}))
    os.chown(path, 4242, 4242)


IN_THE_WAY: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo, "sparse-2GB": _sparse, "world-writable": _world_writable, "foreign": _foreign,
    "dev-zero": _dev_zero, "list": _json_list,
}  # fmt: skip


def metadata(path: Path) -> tuple[int, ...]:
    """What shows whether `path` was replaced or rewritten (its content may be 2 GB: not read)."""
    info = path.lstat()
    return info.st_ino, info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns


@pytest.mark.parametrize("case", sorted(IN_THE_WAY))
def test_default_save_refuses_to_replace_what_it_did_not_write(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Each thing at the default path: `%tfgpu default save` is one UsageError line naming the file
    and leaves it as it was; with the file removed, the same save works."""
    from IPython.core.error import UsageError
    from IPython.core.profiledir import ProfileDir

    profile = ProfileDir.create_profile_dir(str(tmp_path / "profile"))
    monkeypatch.setattr(shell, "profile_dir", profile)
    path = persist.default_path(profile.location)
    IN_THE_WAY[case](path)
    before = metadata(path)
    with pytest.raises(UsageError) as info:
        bounded(lambda: shell.run_line_magic("tfgpu", "default save"), READ_BOUND)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and "replaces only files it wrote" in message, message
    assert metadata(path) == before
    path.unlink()
    shell.run_line_magic("tfgpu", "default save")
    shell.run_line_magic("tfgpu", "default save")  # its own file: replaced
    assert persist.read_policy(path) is not None


# ----- in a real kernel: what `%load_ext` does with hostile pending and default files ------------------
LOAD = "from tfgpu_magic.views.magics import load as _load\n_magics = _load(get_ipython())"
"""What `%load_ext tfgpu_magic` runs (the module is loaded already, so it is called directly)."""
PATHS = (
    "import tfgpu_magic.jupyter.persist as _p, tfgpu_magic.jupyter.startup as _s\n"
    "print(_p.pending_path(_s.current_kernel_key(get_ipython())))\n"
    "print(_p.default_path(get_ipython().profile_dir.location))"
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[tuple[KernelConnection, Path, Path]]:
    """A kernel on a temp-named connection file (as jupyter_client names it), the extension loaded;
    and its pending and default policy paths."""
    with isolated_jupyter("tfgpu-hostile-") as env, standalone_kernel(env, naming="temp") as connection:
        connection.ok("%load_ext tfgpu_magic")
        pending, default = (Path(line) for line in connection.ok(PATHS).stdout.split())
        yield connection, pending, default


@pytest.mark.parametrize("where", ["pending", "default"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_at_load_is_one_warning_in_a_kernel(kernel, case: str, where: str):
    """Loading the extension with the hostile thing at the pending or the default path: the cell
    ends within seconds, one warning line naming the file, no traceback, the file as it was."""
    connection, pending, default = kernel
    path = pending if where == "pending" else default
    HOSTILE[case](path)
    try:
        before = snapshot(path)
        result = connection.run(LOAD, timeout=20)
        assert result.status == "ok" and not result.errors, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        source = "pending policy" if where == "pending" else "saved default"
        assert len(lines) == 1 and lines[0].startswith(f"tfgpu_magic: ignoring the {source}: "), lines
        assert str(path) in lines[0]
        assert snapshot(path) == before
    finally:
        path.unlink()


def test_kernel_restarted_onto_a_fifo_starts(kernel):
    """A FIFO at this kernel's pending path and at the default path, then a restart by its manager
    (what a front end does): the new kernel answers, its first cell carries one warning per file,
    and both FIFOs are still there."""
    connection, pending, default = kernel
    connection.ok("%tfgpu autoload on")
    _fifo(pending)
    _fifo(default)
    try:
        old_pid = connection.pid()
        connection.manager.restart_kernel(now=True)
        wait_until(lambda: connection.pid(timeout=5) != old_pid, 60, "restarted kernel answering", interval=0.2)
        first = connection.ok("pass").output
        warnings = [line for line in first.splitlines() if line.startswith("tfgpu_magic: ignoring the")]
        assert len(warnings) == 2 and all("not a regular file" in line for line in warnings), first
        assert stat.S_ISFIFO(pending.lstat().st_mode) and stat.S_ISFIFO(default.lstat().st_mode)
    finally:
        pending.unlink(missing_ok=True)
        default.unlink(missing_ok=True)
        connection.ok("%tfgpu autoload off")


def test_huge_number_in_json_is_one_plain_line():
    """Python's digit-limit error carries advice for programmers (`sys.set_int_max_str_digits`): the
    warning says what is wrong with the file instead."""
    from tfgpu_magic import safefile
    from tfgpu_magic.errors import PolicyError

    with pytest.raises(PolicyError) as info:
        safefile.loads('{"cpu_devices": ' + "1" * 5000 + "}", "policy.json")
    assert str(info.value) == "policy.json: a number with more than 4,300 digits"

"""The policy kept for a kernel's next start (`tfgpu_magic.jupyter.kept`): where it is worked out once per
kernel, and a pending file that cannot be voided is said once per cause, not at every policy edit.

The kernel is a stand-in shell whose connection file `startup.connection_file` returns (counted); the pending
files are real files in a temporary runtime dir, read by the real `persist`.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfgpu_magic.jupyter import kept, persist
from tfgpu_magic.jupyter.startup import kernel_key
from tfgpu_magic.language.policy import Policy

VOID_FAILED = "the policy kept for the next start could not be voided"


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SimpleNamespace, Path, list[Path]]:
    """A kernel's shell on `kernel-k1.json` in a temporary runtime dir, and the connection-file look-ups made."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    connection = tmp_path / "kernel-k1.json"
    connection.touch()
    looked: list[Path] = []
    monkeypatch.setattr(kept, "connection_file", lambda shell: looked.append(connection) or connection)
    return SimpleNamespace(kernel=object()), connection, looked


def test_the_kept_policy_is_read_at_each_status_but_its_place_worked_out_once(
        kernel: tuple[SimpleNamespace, Path, list[Path]]) -> None:
    shell, connection, looked = kernel
    assert kept.kept_policy(shell) is None
    persist.store_pending(kernel_key(connection), Policy(cpu_devices=2), connection_file=connection)
    assert [kept.kept_policy(shell) for _ in range(3)] == [Policy(cpu_devices=2)] * 3
    assert kept.void_on_change(shell) is not None
    assert len(looked) == 1


def test_a_pending_file_that_cannot_be_voided_is_said_once_per_cause(
        kernel: tuple[SimpleNamespace, Path, list[Path]], capsys: pytest.CaptureFixture[str]) -> None:
    shell, connection, _ = kernel
    path = persist.pending_path(kernel_key(connection))
    path.write_text("not JSON", encoding="utf-8")
    os.chmod(path, 0o600)
    void = kept.void_on_change(shell)
    assert void is not None
    for growth in (True, False, True):  # three policy edits
        void(SimpleNamespace(policy=Policy(growth=growth)))
    first = [line for line in capsys.readouterr().err.splitlines() if VOID_FAILED in line]
    assert len(first) == 1, first
    path.write_text("[]", encoding="utf-8")  # another cause: said once too
    for growth in (True, False):
        void(SimpleNamespace(policy=Policy(growth=growth)))
    second = [line for line in capsys.readouterr().err.splitlines() if VOID_FAILED in line]
    assert len(second) == 1 and second != first, second
    assert path.exists()  # an unusable file is left, as `persist.void_pending` says

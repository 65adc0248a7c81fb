"""`slurm_queue.run`, the one place a Slurm command runs: a command whose caller gives up (cancelled,
or a timeout around it, as when a server stops or a start fails) is killed and reaped, not left
running. Real child processes (`sh`, `sleep`); no Slurm needed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from servers import pid_alive, wait_until

from tfgpu_magic.jupyter import slurm_queue
from tfgpu_magic.jupyter.slurm_queue import SlurmError


def slow_command(pid_file: Path) -> list[str]:
    """A command that writes its pid and then hangs, as an `scontrol` against a busy slurmctld."""
    return ["sh", "-c", f'echo $$ > "{pid_file}"; exec sleep 300']


def child_pid(pid_file: Path) -> int:
    return int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, "the child's pid"))


@pytest.mark.parametrize("how", ["cancel", "outer timeout"])
def test_a_command_whose_caller_gives_up_is_killed_and_reaped(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "pid"

    async def scenario() -> int:
        task = asyncio.ensure_future(slurm_queue.run(slow_command(pid_file)))
        pid = await asyncio.to_thread(child_pid, pid_file)
        if how == "cancel":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(task, 0.5)
        return pid

    began = time.monotonic()
    pid = asyncio.run(scenario())
    assert time.monotonic() - began < 10
    assert not pid_alive(pid), f"the child {pid} lives on after its caller gave up"
    assert not Path(f"/proc/{pid}").exists(), f"the child {pid} was killed but not reaped"


def test_a_command_past_its_own_timeout_is_one_line_and_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(SlurmError, match=r"^sh did not answer within 1 s$"):
        asyncio.run(slurm_queue.run(slow_command(pid_file), timeout=1))
    assert not Path(f"/proc/{child_pid(pid_file)}").exists()


def test_a_command_that_answers_gives_its_status_and_output() -> None:
    assert asyncio.run(slurm_queue.run(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin="in")) == (3, "in", "oops\n")

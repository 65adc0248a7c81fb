"""The kernel's publisher watch (`jupyter.kernelstate.Publisher._watch_loop`) outlives a failed look or write.

A tick that raises (an NVML hiccup, a state read mid-change) used to end the watch for good: the kernel never
published a memory figure or a cell's end again. A write that failed (the runtime dir full for a moment) used
to count its cells as published: they never reached the server. Here the real watch thread ticks every 50 ms
over a controller on FakeTF; the failures are injected at the tick and at `safefile.write_atomic`. What this
cannot show: real GPUs (FakeTF and the fake NVML stand in).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_tf import FakeTF
from servers import wait_until
from test_serverext import _published, fake_kernel, kernel_shell  # noqa: F401 (a fixture)

from tfgpu_magic import safefile
from tfgpu_magic.controller import Controller
from tfgpu_magic.jupyter import kernelstate

TICK = 0.05


@pytest.fixture(autouse=True)
def _quick_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernelstate, "MEMORY_SECONDS", TICK)


def publishing(connection: Path, controller: Controller) -> tuple[kernelstate.Publisher, Path, logging.Logger]:
    """A publisher whose kernel has its own log, the frameworks' moment already looked at (so a cell's end is
    published by the watch's tick, not by `after_cell`)."""
    shell = kernel_shell(connection)
    shell.kernel.log = logging.getLogger("tfgpu-test-kernel")
    publisher = kernelstate.start_publishing(shell, controller)
    assert publisher is not None
    publisher.after_cell()
    return publisher, kernelstate.state_path("k1", connection.parent), shell.kernel.log


def last_cell(path: Path) -> dict[str, Any] | None:
    cells = _published(path)["cells"]
    return cells[-1] if cells else None


def test_a_tick_that_raises_once_is_logged_and_the_next_tick_publishes_the_cell(
        fake_kernel: tuple[FakeTF, Controller, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _, controller, connection = fake_kernel
    publisher, path, log = publishing(connection, controller)
    real, ticks = publisher._tick, []

    def flaky() -> bool:
        ticks.append(1)
        if len(ticks) == 1:
            raise OSError("NVML hiccup")
        return real()

    monkeypatch.setattr(publisher, "_tick", flaky)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        publisher.before_cell(SimpleNamespace(store_history=True))  # starts the watch
        wait_until(lambda: ticks, 10, "the failing tick", 0.01)
        publisher.after_cell(SimpleNamespace(execution_count=7))  # the frameworks' moment as it was: no write here
        wait_until(lambda: (cell := last_cell(path)) and cell["execution_count"] == 7 and cell["end"], 10,
                   "the tick after the failed one publishing the cell's end", 0.01)
    assert publisher.watching is not None and publisher.watching.is_alive()
    said = [record for record in caplog.records if record.name == log.name]
    assert [record.levelno for record in said] == [logging.WARNING] and "NVML hiccup" in caplog.text


def test_a_lasting_failure_is_logged_once_and_the_ticks_slow_down(
        fake_kernel: tuple[FakeTF, Controller, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Failing ticks wait 1, 2, 4, then `FAILED_TICKS_WAIT` ticks: about 7 ticks in 2 s of 50 ms ticks, not 40."""
    _, controller, connection = fake_kernel
    publisher, path, log = publishing(connection, controller)
    ticks: list[int] = []

    def broken() -> bool:
        ticks.append(1)
        raise RuntimeError("driver gone")

    monkeypatch.setattr(publisher, "_tick", broken)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        publisher.before_cell(SimpleNamespace(store_history=True))
        wait_until(lambda: len(ticks) >= 5, 10, "five failing ticks", 0.01)
        publisher._stopped.wait(40 * TICK)
    assert len(ticks) <= 5 + 40 // kernelstate.FAILED_TICKS_WAIT + 1, f"{len(ticks)} ticks"
    levels = [record.levelno for record in caplog.records if record.name == log.name]
    assert levels[0] == logging.WARNING and set(levels[1:]) == {logging.DEBUG}
    assert publisher.watching is not None and publisher.watching.is_alive()


def test_the_cells_of_a_failed_write_go_out_with_the_next_write(
        fake_kernel: tuple[FakeTF, Controller, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, controller, connection = fake_kernel
    publisher, path, _ = publishing(connection, controller)
    real, attempts = safefile.write_atomic, []

    def full_once(*args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(safefile, "write_atomic", full_once)
    publisher.before_cell(SimpleNamespace(store_history=True))  # the watch's tick writes its start: that write fails
    wait_until(lambda: attempts, 10, "the failed write", 0.01)
    wait_until(lambda: (cell := last_cell(path)) and cell["end"] is None, 10,
               "the next tick publishing the cell the failed write held", 0.01)
    assert len(attempts) == 2 and publisher.writes >= 2

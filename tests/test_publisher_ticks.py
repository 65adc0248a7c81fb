"""The kernel's publisher watch (`jupyter.kernelstate.Publisher`, a look every `MEMORY_SECONDS`) reads only the
figures that move between cells: once a full look has read the state (one plan), a tick reads TensorFlow's
tensor counts and JAX's and PyTorch's own figures, builds no plan, and writes only when a figure moved. A
cell that ran (or a policy change) makes the next look a full one, since the state may have changed in it.

The ticks are the real watch thread's (`MEMORY_SECONDS` made short); each tick is counted by the figures it
reads through the fakes (`FakeMemory.info`, `FakeTorch.memory`), and every `build_plan` the controller makes
is counted. What this cannot show: real GPUs (FakeTF, FakeMemory, FakeTorch and the fake NVML stand in).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from fake_memory import FakeMemory
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from fake_torch import FakeTorch
from servers import wait_until
from test_plans_per_call import plans  # noqa: F401 (a fixture: counts of `Controller.plan` and `build_plan`)
from test_serverext import GIB, _published, fake_kernel, kernel_shell  # noqa: F401 (a fixture)

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import MIB, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.jupyter import kernelstate

TICKS = 5
"""Ticks watched with nothing changing."""


@pytest.fixture(autouse=True)
def _quick_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch ticks every 50 ms."""
    monkeypatch.setattr(kernelstate, "MEMORY_SECONDS", 0.05)


def ticks_pass(count: Callable[[], int], reads_per_tick: int, ticks: int = TICKS) -> None:
    """Wait until the watch has looked `ticks` more times (each look reads `reads_per_tick` figures)."""
    start = count()
    wait_until(lambda: count() >= start + ticks * reads_per_tick, 10, f"{ticks} ticks of the watch", 0.01)


def without_time(record: dict[str, Any]) -> dict[str, Any]:
    """A published record less what only the write adds (its time) and the cells (marked in memory)."""
    return {key: value for key, value in record.items() if key not in ("written", "cells")}


def test_ticks_with_nothing_changing_build_no_plan_and_a_moved_figure_is_published(
        fake_kernel: tuple[FakeTF, Controller, Path], plans: dict[str, int]) -> None:
    fake, controller, connection = fake_kernel
    controller.edit([controller.parse("limit 4GB")])
    memory = FakeMemory(fake)
    publisher = kernelstate.start_publishing(kernel_shell(connection), controller, memory_api=memory)
    assert publisher is not None
    path = kernelstate.state_path("k1", connection.parent)
    fake.initialize()
    memory.allocate("GPU:0", 512 * MIB)
    assert kernelstate.changed() is True and plans["build_plan"]  # the full look: the state, with its plan
    reads = lambda: sum(call[0] == "info" for call in memory.calls)  # noqa: E731 (two GPUs: two a tick)
    ticks_pass(reads, 2, 1)
    plans.update(plan=0, build_plan=0)
    writes = publisher.writes
    ticks_pass(reads, 2)
    assert plans["build_plan"] == 0, f"{plans['build_plan']} plans built in {TICKS} ticks with nothing changing"
    assert publisher.writes == writes  # nothing moved: nothing written
    memory.allocate("GPU:1", GIB)  # a long cell's work: no event
    wait_until(lambda: _published(path)["tensorflow"]["memory"][1]["current"] == GIB, 10,
               "the tick publishing the figure")
    assert plans["build_plan"] == 0 and publisher.writes == writes + 1
    assert without_time(_published(path)) == kernelstate.snapshot(controller, "k1", False, memory)  # a full look's


def test_after_a_cell_the_next_look_is_a_full_one_and_publishes_what_the_cell_changed(
        fake_kernel: tuple[FakeTF, Controller, Path], plans: dict[str, int]) -> None:
    """A cell may change what no event tells (here Keras's backend variable): the look after it reads the
    whole state again, with its plan; the ticks after that read figures only."""
    fake, controller, connection = fake_kernel
    memory = FakeMemory(fake)
    publisher = kernelstate.start_publishing(kernel_shell(connection), controller, memory_api=memory)
    assert publisher is not None
    path = kernelstate.state_path("k1", connection.parent)
    fake.initialize()
    kernelstate.changed()
    reads = lambda: sum(call[0] == "info" for call in memory.calls)  # noqa: E731
    ticks_pass(reads, 2, 1)
    publisher.before_cell(SimpleNamespace(store_history=True))
    publisher.after_cell(SimpleNamespace(execution_count=2))  # the first cell's look at the frameworks
    wait_until(lambda: _published(path)["cells"][-1]["end"], 10, "the first cell published")
    assert _published(path)["frameworks"]["keras"] is None
    plans.update(plan=0, build_plan=0)
    publisher.before_cell(SimpleNamespace(store_history=True))
    controller.environ["KERAS_BACKEND"] = "jax"  # the cell's work
    publisher.after_cell(SimpleNamespace(execution_count=3))  # the frameworks' moment is as it was: no look
    ended = lambda: (found := _published(path))["cells"][-1]["execution_count"] == 3 and found  # noqa: E731
    published = wait_until(lambda: (found := ended()) and found["cells"][-1]["end"] and found, 10,
                           "the look after the cell publishing it and its change")
    assert plans["build_plan"] and published["frameworks"]["keras"]["backend"] == "jax"
    ticks_pass(reads, 2, 1)
    plans.update(plan=0, build_plan=0)
    ticks_pass(reads, 2)
    assert plans["build_plan"] == 0
    controller.edit([controller.parse("growth on")])  # a policy change: a full look at once
    assert _published(path)["policy"]["growth"] is True and plans["build_plan"]


def test_pytorchs_own_figures_are_followed_by_the_ticks_without_a_plan(tmp_path: Path, plans: dict[str, int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch started in a cell: its allocated and reserved bytes per device move during the next cells
    and the ticks publish them, placed on their cards as the full look placed them, building no plan."""
    env: dict[str, str] = {}
    fake = FakeTF(2, environ=env)
    torch = FakeTorch(environ=env, tf=fake)
    read: list[int] = []
    real_memory = torch.memory
    monkeypatch.setattr(torch, "memory", lambda device: read.append(device) or real_memory(device))
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    controller = Controller(api=fake, environ=env, catalog=catalog, torch=torch)
    (tmp_path / "runtime").mkdir()
    path = kernelstate.state_path("k1", tmp_path / "runtime")
    try:
        publisher = kernelstate.start_publishing(kernel_shell(tmp_path / "runtime" / "kernel-k1.json"), controller)
        assert publisher is not None
        torch.import_torch()
        torch.allocate(0, 512)  # the cell's first CUDA op
        publisher.after_cell()
        devices = torch.device_count()
        assert _published(path)["frameworks"]["torch"]["memory"][0]["current"] == 512 * MIB
        ticks_pass(lambda: len(read), devices, 1)
        plans.update(plan=0, build_plan=0)
        writes = publisher.writes
        ticks_pass(lambda: len(read), devices)
        assert plans["build_plan"] == 0 and publisher.writes == writes
        torch.allocate(1, 256)
        wait_until(lambda: _published(path)["frameworks"]["torch"]["memory"][1]["current"] == 256 * MIB, 10,
                   "the tick publishing PyTorch's figure")
        assert plans["build_plan"] == 0
        assert without_time(_published(path)) == kernelstate.snapshot(controller, "k1", False)
    finally:
        kernelstate.stop_publishing()

"""The panel's live memory refresh (every `REFRESH_SECONDS`) reads only the figures it shows: once a full
look has read the rows (cards, logical devices, caps: fixed once TensorFlow's runtime is initialized), a
tick reads TensorFlow's tensor counts and nothing else, no plan and no state. A policy change, or a
runtime initialized since, makes the next tick a full look again."""

from __future__ import annotations

import sys
from typing import Any, Iterator

import pytest
from fake_memory import FakeMemory
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.language.sizes import bytes_text
from tfgpu_magic.tf import memory as tf_memory
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.panel import Panel
from tfgpu_magic.views.watch import with_tensor_figures

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _disarm_hook() -> Iterator[None]:
    yield
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Panel, Controller, FakeTF, FakeMemory, list[int]]]:
    """A panel with live memory ticked (its timer stopped: the test ticks), over FakeTF with two GPUs
    and `limit 1GB`, TensorFlow's memory figures from FakeMemory; the list counts `Controller.plan`."""
    tf = FakeTF(2)
    memory = FakeMemory(tf)
    monkeypatch.setattr(tf_memory, "TensorFlowMemory", lambda: memory)
    controller = Controller(api=tf, environ={}, catalog=InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus())))))
    controller.edit([controller.parse("limit 1GB")])
    plans: list[int] = []
    real = controller.plan

    def plan(*args: Any, **kwargs: Any) -> Any:
        plans.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(controller, "plan", plan)
    panel = Panel(controller)
    panel.live.value = True
    panel.set_live(False)  # the box stays ticked; the test ticks instead of the timer
    yield panel, controller, tf, memory, plans
    panel.close()


def test_a_tick_reads_the_tensor_figures_and_builds_no_plan(live) -> None:
    panel, _, tf, memory, plans = live
    tf.initialize()
    panel.refresh_memory()  # the full look (after a cell): the rows and their caps
    assert plans and f"tensors {bytes_text(0)}" in panel.figures.value
    plans.clear()
    memory.allocate("GPU:0", 512 * MIB)
    panel.refresh_figures()
    assert plans == [] and f"tensors {bytes_text(512 * MIB)}" in panel.figures.value
    assert ("info", "GPU:0") in memory.calls and "cap 1.0 GiB" in panel.figures.value
    memory.free("GPU:0", 512 * MIB)
    panel.refresh_figures()
    assert plans == [] and f"tensors {bytes_text(0)} (peak {bytes_text(512 * MIB)})" in panel.figures.value


def test_a_runtime_initialized_since_the_last_look_makes_a_full_look(live) -> None:
    panel, _, tf, _, plans = live
    panel.refresh_memory()  # before initialization: the cap that will apply, no tensors
    assert "cap at initialization" in panel.figures.value
    tf.initialize()
    plans.clear()
    panel.refresh_figures()
    assert plans and f"tensors {bytes_text(0)}" in panel.figures.value and "cap at initialization" not in panel.figures.value


def test_a_policy_change_makes_the_next_tick_a_full_look(live) -> None:
    panel, controller, _, _, plans = live
    panel.refresh_memory()
    assert "cap at initialization 1.0 GiB" in panel.figures.value
    controller.edit([controller.parse("limit 2GB")])
    plans.clear()
    panel.refresh_figures()
    assert plans and "cap at initialization 2.0 GiB" in panel.figures.value


def test_rows_read_before_initialization_are_stale_once_it_came() -> None:
    tf = FakeTF(1)
    memory = FakeMemory(tf)
    assert with_tensor_figures([], memory) == []
    controller = Controller(api=tf, environ={}, catalog=InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus())))))
    rows = tf_memory.memory_rows(controller, memory)
    assert rows and not any(row.initialized for row in rows)
    assert with_tensor_figures(rows, memory) == rows  # not initialized: nothing to read, rows as they are
    tf.initialize()
    assert with_tensor_figures(rows, memory) is None

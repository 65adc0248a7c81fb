"""`%tfgpu watch on | off` (`tfgpu_magic.views.watch`) on the real in-process IPython shell.

The cells' GPU memory is played by the fakes, which decide it: FakeMemory (TensorFlow's tensor bytes
and peaks per logical GPU, `reset_memory_stats` setting the peak to the current figure), FakeNvml
(this process's MiB on each card, changed by the cells), FakeTF (initialized or not). The shell's record of
each cell's memory (`tf.cellmemory`, started at TensorFlow's import) reads the same FakeMemory, as both read
the one TensorFlow in a kernel: the peak's reset before each cell is shared, one per logical GPU.
The per-cell cost is a `make bench` figure (empty cell, watch on / off), not a test.
"""

from __future__ import annotations

import io
import os
import re
from typing import Iterator

import pytest
from fake_memory import FakeMemory
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.interactiveshell import InteractiveShell
from kernels import tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)
from test_memory import drop_recorder

from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import cellmemory, quietimport
from tfgpu_magic.views import watch

MIB = 1 << 20
EVENTS = ("pre_run_cell", "post_run_cell")


@pytest.fixture
def ipshell() -> Iterator[InteractiveShell]:
    from IPython.testing import globalipapp

    shell = globalipapp.get_ipython()
    yield shell
    watch.watch_off(shell)
    quietimport.disarm()
    drop_recorder(shell)


def hooks(shell: InteractiveShell) -> dict[str, int]:
    return {event: len(shell.events.callbacks[event]) for event in EVENTS}


def gpu_machine(initialized: bool = True) -> tuple[FakeTF, Controller, FakeMemory, FakeNvml]:
    """Cards 0 and 1 visible (`visible 0,1`, limit 4 GB on GPU 0); this process holds 1 GiB on card 0."""
    nvml = FakeNvml(four_gpus())
    env: dict[str, str] = {}
    fake = FakeTF(4, imported=False, environ=env)
    ctl = Controller(api=fake, environ=env, catalog=InventoryCatalog(read_inventory(Nvml(module=nvml))))
    ctl.edit([ctl.parse("visible 0,1"), ctl.parse("limit 4GB 0")])
    fake.imported = True
    quietimport.disarm()
    ctl.apply()
    if initialized:
        fake.initialize()
    return fake, ctl, FakeMemory(fake), nvml


def start(shell: InteractiveShell, initialized: bool = True) -> tuple[FakeMemory, FakeNvml, io.StringIO, FakeTF]:
    """The watch on, after the shell's per-cell record (`gpu_machine` started one over the real, absent
    TensorFlow: this one reads the fake)."""
    fake, ctl, mem, nvml = gpu_machine(initialized)
    drop_recorder(shell)
    cellmemory.record_cells(shell, mem)
    out = io.StringIO()
    watch.watch_on(shell, ctl, mem, lambda: read_inventory(Nvml(module=nvml)), out)
    shell.user_ns.update(mem=mem, nvml=nvml, pid=os.getpid(), MIB=MIB)
    return mem, nvml, out, fake


def test_off_by_default_and_off_leaves_no_hook(ipshell: InteractiveShell) -> None:
    assert watch.current(ipshell) is None
    gpu_machine()  # TensorFlow's import starts the shell's own cell hooks once: count only the watch's
    before = hooks(ipshell)
    start(ipshell)
    assert hooks(ipshell) == {event: count + 1 for event, count in before.items()}
    assert watch.watch(None, ipshell, "on") == "Memory watch is already on."  # type: ignore[arg-type]
    assert watch.watch(None, ipshell, "off") == "Memory watch off: no hook left."  # type: ignore[arg-type]
    assert hooks(ipshell) == before and watch.current(ipshell) is None
    assert watch.watch(None, ipshell, "off") == "Memory watch is off."  # type: ignore[arg-type]


def test_one_line_per_gpu_whose_memory_moved(ipshell: InteractiveShell) -> None:
    mem, nvml, out, _ = start(ipshell)
    ipshell.run_cell("mem.allocate('GPU:0', 512 * MIB); mem.allocate('GPU:0', 256 * MIB); mem.free('GPU:0', 256 * MIB)\n"
                     "nvml.gpus[0].processes[0] = (pid, 2048)")
    assert out.getvalue().splitlines() == [
        "tfgpu watch: GPU 0: cell peak 768 MiB, held 2.0 GiB (+1.0 GiB), tensors +512 MiB, "
        "cap 4.0 GiB (limit on GPU 0, 5% of the card)"]
    assert ("reset", "GPU:0") in mem.calls and ("reset", "GPU:1") in mem.calls
    out.truncate(0), out.seek(0)
    ipshell.run_cell("x = 1")
    assert out.getvalue() == ""  # nothing moved: no line


def test_the_peak_is_the_cells_own(ipshell: InteractiveShell) -> None:
    """Reset before the cell: an earlier cell's peak does not show up again."""
    mem, nvml, out, _ = start(ipshell)
    ipshell.run_cell("mem.allocate('GPU:1', 900 * MIB); mem.free('GPU:1', 900 * MIB)")
    ipshell.run_cell("mem.allocate('GPU:1', 100 * MIB); mem.free('GPU:1', 100 * MIB)")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tfgpu watch: GPU 1: cell peak 900 MiB, held 0 MiB (+0 MiB), tensors +0 MiB")
    assert lines[1].startswith("tfgpu watch: GPU 1: cell peak 100 MiB")


def test_steady_growth_is_flagged(ipshell: InteractiveShell) -> None:
    mem, nvml, out, _ = start(ipshell)
    for cell in range(watch.GROWTH_CELLS):
        ipshell.run_cell(f"nvml.gpus[0].processes[0] = (pid, {1024 + 256 * (cell + 1)})")
    flags = [line for line in out.getvalue().splitlines() if "grew" in line]
    assert flags == [f"tfgpu watch: GPU 0: held memory grew in each of the last {watch.GROWTH_CELLS} cells (+1.0 GiB "
                     "in all): something keeps references across cells (a list of results, a growing history, "
                     "retraced tf.functions)"]


def test_before_initialization_the_hooks_only_read_the_state(ipshell: InteractiveShell) -> None:
    mem, nvml, out, fake = start(ipshell, initialized=False)
    ipshell.run_cell("y = 2")
    assert mem.calls == [] and out.getvalue() == ""
    ipshell.user_ns["fake"] = fake
    ipshell.run_cell("fake.initialize(); mem.allocate('GPU:0', 64 * MIB)")
    assert out.getvalue().startswith("tfgpu watch: GPU 0: cell peak 64 MiB")  # the initializing cell


def resets_per_cell(shell: InteractiveShell, mem: FakeMemory, cells: int = 3) -> list[int]:
    """`reset_memory_stats` calls in each of `cells` cells."""
    counts = []
    for _ in range(cells):
        before = len(mem.calls)
        shell.run_cell("mem.allocate('GPU:0', MIB)")
        counts.append(sum(call[0] == "reset" for call in mem.calls[before:]))
    return counts


def test_one_reset_per_logical_gpu_a_cell_watch_on_or_off(ipshell: InteractiveShell) -> None:
    """The watch and the per-cell record read the same peak: with the watch on, a cell still resets each of
    the two logical GPUs once (the record's reset), as with it off; both report the cell's own peak."""
    mem, nvml, out, _ = start(ipshell)
    recorder = cellmemory.recorder(ipshell)
    assert resets_per_cell(ipshell, mem) == [2, 2, 2]
    assert [cell.devices["GPU:0"].peak for cell in recorder.cells] == [MIB, 2 * MIB, 3 * MIB]
    assert [line.split(", ")[0] for line in out.getvalue().splitlines()] == ["tfgpu watch: GPU 0: cell peak 1 MiB",
                                                                           "tfgpu watch: GPU 0: cell peak 2 MiB",
                                                                           "tfgpu watch: GPU 0: cell peak 3 MiB"]
    watch.watch_off(ipshell)
    assert resets_per_cell(ipshell, mem) == [2, 2, 2]


def test_with_the_record_stopped_the_watch_resets_the_peaks_itself(ipshell: InteractiveShell) -> None:
    mem, nvml, out, _ = start(ipshell)
    cellmemory.recorder(ipshell).stop()
    assert resets_per_cell(ipshell, mem, 2) == [2, 2]
    ipshell.run_cell("mem.allocate('GPU:1', 900 * MIB); mem.free('GPU:1', 900 * MIB)")
    ipshell.run_cell("mem.allocate('GPU:1', 100 * MIB); mem.free('GPU:1', 100 * MIB)")
    assert out.getvalue().splitlines()[-1].startswith("tfgpu watch: GPU 1: cell peak 100 MiB")


def test_a_wrong_word_is_a_usage_error(ipshell: InteractiveShell) -> None:
    with pytest.raises(PolicyError, match=re.escape("watch on | off")):
        watch.watch(None, ipshell, "maybe")  # type: ignore[arg-type]

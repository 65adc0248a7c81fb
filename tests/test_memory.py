"""`%tfgpu memory` / `tfgpu_magic.tf.memory.memory()`: one plain dict per visible GPU, never importing
or initializing TensorFlow.

GPU figures come from the fakes, which decide them: FakeNvml's `four_gpus` (the cards, this process
1 GiB on GPU 0, pid 4242 19 GiB there), FakeTF (what TensorFlow lists and records, when CUDA starts)
and FakeMemory (TensorFlow's tensor bytes per logical GPU; it refuses any call before initialization,
as the real calls would initialize the runtime). Real TensorFlow (CPU build) runs in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from fake_memory import FakeMemory
from fake_nvml import OTHER_PID, FakeNvml, four_gpus
from fake_tf import FakeTF
from kernels import quiet_env, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

from tfgpu_magic import importhooks
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import cellmemory, quietimport
from tfgpu_magic.language.sizes import mib_text
from tfgpu_magic.tf.memory import memory, memory_rows
from tfgpu_magic.views.figures import memory_text, summary

GIB = 1 << 30


@pytest.fixture(autouse=True)
def disarm():
    yield
    quietimport.disarm()


def machine(*lines: str, env: dict | None = None, start: str = "before import",
            inventory: Inventory | None = None) -> tuple[FakeTF, Controller, FakeMemory, Inventory]:
    """Four fake cards, the policy `lines`, TensorFlow at `start` (before import, imported, initialized)."""
    inventory = inventory or read_inventory(Nvml(module=FakeNvml(four_gpus())))
    env = {} if env is None else env
    fake = FakeTF(4, imported=False, environ=env)
    ctl = Controller(api=fake, environ=env, catalog=InventoryCatalog(inventory))
    if lines:
        ctl.edit([ctl.parse(line) for line in lines])
    if start != "before import":
        fake.imported = True
        quietimport.disarm()
        ctl.apply()
    if start == "initialized":
        fake.initialize()
    return fake, ctl, FakeMemory(fake), inventory


@pytest.mark.parametrize("start", ["before import", "imported"])
def test_before_initialization_it_says_what_would_apply_and_starts_nothing(start: str) -> None:
    fake, ctl, mem, inventory = machine("visible 0,1", "limit 4GB 0", start=start)
    before = fake.snapshot()
    rows = memory(ctl, mem, inventory)
    assert [(r["gpu"], r["tf_device"]) for r in rows] == [("0", "GPU:0"), ("1", "GPU:1")]
    assert rows[0]["cap_mib"] == 4096 and rows[0]["cap_source"] == "limit on GPU 0"
    assert rows[0]["cap_in_force"] is False and rows[1]["cap_mib"] is None
    assert all(r["tensors_bytes"] is None and r["initialized"] is False for r in rows)
    assert fake.snapshot() == before and mem.calls == []  # nothing started, no TensorFlow memory call
    assert (fake.cuda_ids is None) == (start == "before import")  # applying the limit listed the devices
    text = memory_text(ctl, mem, inventory)
    assert "the cap is what will apply" in text and text.splitlines()[1].split()[:3] == ["0", "GPU:0", "—"]


def test_once_initialized_it_shows_tensors_this_process_others_and_the_cap_in_force() -> None:
    fake, ctl, mem, inventory = machine("visible 0,1", "limit 4GB 0", start="initialized")
    mem.allocate("GPU:0", 3 * GIB)
    mem.free("GPU:0", GIB)
    row = memory(ctl, mem, inventory)[0]
    assert (row["tensors_bytes"], row["peak_bytes"]) == (2 * GIB, 3 * GIB)
    assert (row["process_mib"], row["others_mib"], row["total_mib"]) == (1024, 19456, 81920)
    assert row["other_processes"] == [{"pid": OTHER_PID, "mib": 19456}]
    assert row["cap_in_force"] is True and row["cap_text"] == "4.0 GiB (limit on GPU 0, 5% of the card)"
    line = memory_text(ctl, mem, inventory).splitlines()[1]
    assert "2.0 GiB / 3.0 GiB" in line and "19.0 GiB" in line


def test_the_panel_phrase_before_and_after_initialization() -> None:
    fake, ctl, mem, inventory = machine("visible 0", "limit 4GB 0")
    assert summary(memory_rows(ctl, mem, inventory)[0]) == "cap at initialization 4.0 GiB (limit on GPU 0, 5% of the card)"
    fake, ctl, mem, inventory = machine("visible 0", "limit 4GB 0", start="initialized")
    mem.allocate("GPU:0", 1536 * 1024 * 1024)
    assert summary(memory_rows(ctl, mem, inventory)[0]) == (
        "tensors 1.5 GiB (peak 1.5 GiB) · cap 4.0 GiB (limit on GPU 0, 5% of the card)")


def test_a_split_card_sums_its_logical_gpus_and_numbers_the_next_card_after_them() -> None:
    """FakeMemory decides the logical numbering: card 0's two parts are GPU:0 and GPU:1, card 1 is GPU:2."""
    fake, ctl, mem, inventory = machine("visible 0,1", "split 0 2x2GB", start="initialized")
    mem.allocate("GPU:0", GIB)
    mem.allocate("GPU:1", GIB)
    mem.allocate("GPU:2", 5 * GIB)
    first, second = memory(ctl, mem, inventory)
    assert first["logical_devices"] == ["GPU:0", "GPU:1"] and first["tensors_bytes"] == 2 * GIB
    assert first["cap_parts_mib"] == [2048, 2048] and first["cap_source"] == "split of GPU 0"
    assert second["logical_devices"] == ["GPU:2"] and second["tensors_bytes"] == 5 * GIB


def test_a_policy_changed_after_initialization_is_not_claimed_in_force() -> None:
    fake, ctl, mem, inventory = machine("visible 0", "limit 4GB", start="initialized")
    ctl.edit([ctl.parse("limit 8GB")])
    row = memory(ctl, mem, inventory)[0]
    assert row["cap_mib"] == 4096 and row["cap_source"].startswith("recorded by TensorFlow, not this policy's")


def test_an_inherited_cuda_visible_devices_maps_tensorflows_numbers_to_the_cards() -> None:
    fake, ctl, mem, inventory = machine(env={"CUDA_VISIBLE_DEVICES": "2,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                                        start="initialized")
    rows = memory(ctl, mem, inventory)
    assert [(r["gpu"], r["tf_device"]) for r in rows] == [("2", "GPU:0"), ("1", "GPU:1")]
    assert rows[0]["process_mib"] == 0 and rows[0]["cap_text"].startswith("none (no growth")


def test_indices_in_cudas_default_order_are_not_given_another_cards_figures() -> None:
    """Without `CUDA_DEVICE_ORDER=PCI_BUS_ID` CUDA counts the indices fastest first: TensorFlow's two
    GPUs are listed, but no card's NVML figures are claimed for them (was: GPU 2's and GPU 1's)."""
    fake, ctl, mem, inventory = machine(env={"CUDA_VISIBLE_DEVICES": "2,1"}, start="initialized")
    rows = memory(ctl, mem, inventory)
    assert [(r["gpu"], r["tf_device"], r["total_mib"]) for r in rows] == [(None, "GPU:0", None), (None, "GPU:1", None)]
    assert [line.split()[:2] for line in memory_text(ctl, mem, inventory).splitlines()[1:3]] == [["?", "GPU:0"],
                                                                                                 ["?", "GPU:1"]]


def test_growth_and_the_async_allocator_are_named() -> None:
    fake, ctl, mem, inventory = machine("visible 1", "growth on", start="initialized")
    assert memory(ctl, mem, inventory)[0]["cap_text"] == "none (growth on: the pool grows on demand)"
    fake, ctl, mem, inventory = machine("visible 1", "allocator async", "limit 2GB")
    assert memory(ctl, mem, inventory)[0]["cap_text"].endswith("soft: cuda_malloc_async)")
    fake, ctl, mem, inventory = machine("visible 1", "allocator async", start="initialized")
    assert memory(ctl, mem, inventory)[0]["cap_text"] == "none (cuda_malloc_async: the pool allocates on demand)"


def test_without_gpus_it_is_one_line() -> None:
    fake, ctl, mem, inventory = machine(inventory=Inventory(error="NVML unavailable: no NVIDIA driver here"))
    assert memory(ctl, mem, inventory) == []
    assert memory_text(ctl, mem, inventory) == (
        "No GPU found: NVML unavailable: no NVIDIA driver here. `%tfgpu doctor` says why.")


@pytest.mark.parametrize("mib, text", [(None, "?"), (512, "512 MiB"), (3584, "3.5 GiB"), (1 << 20, "1.0 TiB")])
def test_sizes_read_as_people_read_them(mib, text) -> None:
    assert mib_text(mib) == text


@pytest.mark.tensorflow
def test_real_tensorflow_is_neither_initialized_nor_imported_by_it() -> None:
    script = textwrap.dedent("""
        import sys
        from tfgpu_magic.controller import get_controller
        from tfgpu_magic.tf.memory import memory
        from tfgpu_magic.tf.runtime import runtime_state
        from tfgpu_magic.views.figures import memory_text
        print(memory_text(get_controller()))
        assert "tensorflow" not in sys.modules
        import tensorflow as tf
        memory(get_controller()); memory_text(get_controller())
        assert not runtime_state().initialized and not runtime_state().devices_listed
        tf.constant(1)
        print(memory(get_controller()))
        print(memory_text(get_controller()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=quiet_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, rows, last = proc.stdout.splitlines()
    assert first.startswith("No GPU found: ") and rows == "[]" and last.startswith("No GPU in this process: TensorFlow lists none")


def test_in_a_container_the_memory_of_this_process_and_of_others_is_unknown_not_guessed() -> None:
    """NVML's pids are the host's there (`GpuProcess.is_self` None): no process is this one, and none
    is counted as another's either."""
    found = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    host = found._replace(gpus=tuple(gpu._replace(processes=tuple(p._replace(is_self=None) for p in gpu.processes))
                                     for gpu in found.gpus))
    fake, ctl, mem, _ = machine(inventory=host, start="initialized")
    (first, *_) = memory_rows(ctl, mem, host)
    assert first.gpu == "0" and (first.process_mib, first.others_mib, first.other_processes) == (None, None, ())
    (same, *_) = memory_rows(ctl, mem, found)
    assert same.process_mib == 1024 and same.others_mib == 19 * 1024


def test_pytorchs_own_figures_follow_tensorflows_table_on_the_cards_cuda_shows() -> None:
    """With PyTorch beside TensorFlow, `%tfgpu memory` adds a line per CUDA device of PyTorch's own
    figures (FakeTorch's allocator), each placed on its card by CUDA's order of this process's GPUs
    (`visible 2,3`: cuda:1 is card 3), after the GPU table; nothing for PyTorch before its CUDA starts."""
    from fake_torch import FakeOutOfMemoryError, FakeTorch

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    env: dict[str, str] = {}
    fake = FakeTF(4, imported=False, environ=env)
    torch = FakeTorch(environ=env, tf=fake, totals_mib=[gpu.memory_total_mib or 0 for gpu in inventory.gpus])
    ctl = Controller(api=fake, environ=env, catalog=InventoryCatalog(inventory), torch=torch)
    ctl.edit([ctl.parse("visible 2,3"), ctl.parse("limit 8GB 3")])
    importhooks.disarm("torch")  # armed for a real `import torch` where PyTorch is installed: the fake imports
    torch.import_torch()
    ctl.apply()
    assert "PyTorch" not in memory_text(ctl, inventory=inventory)
    torch.allocate(1, 1024)
    with pytest.raises(FakeOutOfMemoryError):  # past 8 GB of the 40 GiB card: the fraction holds
        torch.allocate(1, 8 * 1024)
    lines = memory_text(ctl, inventory=inventory).splitlines()
    third, fourth = (gpu.uuid[:12] for gpu in inventory.gpus[2:])
    assert lines[-2:] == [f"PyTorch cuda:0 ({third}…): allocated 0 MiB, reserved 0 MiB",
                          f"PyTorch cuda:1 ({fourth}…): allocated 1.0 GiB, reserved 1.0 GiB"]


# ----- each cell's memory (`tf.cellmemory`), shown by `%tfgpu memory` per card and cell ------------------
@pytest.fixture
def ipshell():
    """The real test IPython shell; whatever recorder a test started is stopped and dropped after it."""
    from IPython.testing import globalipapp

    shell = globalipapp.get_ipython()
    yield shell
    drop_recorder(shell)


def drop_recorder(shell) -> None:
    found = cellmemory.recorder(shell)
    if found is not None:
        found.stop()
        delattr(shell, "_tfgpu_cell_memory")


def recording_with(shell, mem: FakeMemory, **clock):
    """A recorder on `shell` reading `mem`: `machine()` applied the policy with TensorFlow imported, which
    started one on the test shell reading the real (absent) TensorFlow; this replaces it."""

    drop_recorder(shell)
    return cellmemory.record_cells(shell, mem, **clock)


def ours(shell) -> list:
    """The recorder's hooks on `shell`."""
    return [c for event in ("pre_run_cell", "post_run_cell") for c in shell.events.callbacks[event]
            if isinstance(getattr(c, "__self__", None), cellmemory.CellRecorder)]


def run(shell, code: str) -> int:
    """Run `code` as a stored cell (it gets an execution count); its count."""
    result = shell.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec
    return result.execution_count


def test_each_cell_is_recorded_before_peak_during_and_after_and_shown_per_card(ipshell) -> None:
    """Two visible cards; cells allocate and free on GPU:0 (card 0) and GPU:1 (card 1): the table of each
    card gives each cell's figures before, peak during (`reset_memory_stats` before each cell makes the
    peak the cell's own) and after; the summary names the peak's cell; the HTML has the same rows and a
    chart whose text equivalent is the summary."""
    from xml.etree import ElementTree

    from tfgpu_magic.views.figures import memory_result

    fake, ctl, mem, inventory = machine("visible 0,1", start="initialized")
    ticks = iter(range(1000))
    recorder = recording_with(ipshell, mem, clock=lambda: float(next(ticks)))
    ipshell.user_ns.update(mem=mem, GIB=GIB)
    first = run(ipshell, "mem.allocate('GPU:0', 3 * GIB); mem.free('GPU:0', 2 * GIB)")
    peak = run(ipshell, "mem.allocate('GPU:0', 5 * GIB); mem.free('GPU:0', 4 * GIB); mem.allocate('GPU:1', GIB)")
    last = run(ipshell, "mem.free('GPU:0', GIB)")
    assert [cell.execution_count for cell in recorder.cells] == [first, peak, last]
    assert recorder.cells[1].devices["GPU:0"] == (GIB, 6 * GIB, 2 * GIB)  # 1 GiB held + 5 GiB at the peak
    assert recorder.cells[0].start < recorder.cells[0].end < recorder.cells[1].start
    result = memory_result(ctl, ipshell, mem, inventory)
    text = result.text()
    assert text.startswith(memory_text(ctl, mem, inventory))
    card0 = text.split("\n\n")[1].splitlines()
    assert card0[0] == (f"Per cell, TensorFlow's tensors on GPU 0, cells [{first}] to [{last}]: "
                        f"peak 6.0 GiB during cell [{peak}]; now 1.0 GiB")
    assert [line.split() for line in card0[1:]] == [
        ["cell", "before", "peak", "during", "after"],
        [f"[{first}]", "0", "MiB", "3.0", "GiB", "1.0", "GiB"],
        [f"[{peak}]", "1.0", "GiB", "6.0", "GiB", "2.0", "GiB"],
        [f"[{last}]", "2.0", "GiB", "2.0", "GiB", "1.0", "GiB"]]
    card1 = text.split("\n\n")[2].splitlines()
    assert card1[0].startswith("Per cell, TensorFlow's tensors on GPU 1, cells") and "peak 1.0 GiB during cell" in card1[0]
    html = result.html()
    svg = ElementTree.fromstring(html[html.index("<svg"):html.index("</svg>") + 6])
    assert svg.get("role") == "img" and svg.get("aria-label") == card0[0].removeprefix("Per cell, TensorFlow's tensors on ")
    assert svg.find("{http://www.w3.org/2000/svg}title").text == svg.get("aria-label")
    bars = svg.findall("{http://www.w3.org/2000/svg}rect")
    assert [bar.get("style").startswith("fill:var(--jp-brand-color1") for bar in bars] == [False, True, False]
    assert float(bars[1].get("height")) > float(bars[0].get("height")) > 0  # 6 GiB against 3 GiB
    assert f"<td style='text-align:left;vertical-align:top;padding:1px 8px 1px 0'>[{peak}]</td>" in html


def test_before_initialization_the_hooks_only_read_the_state_and_the_initializing_cell_starts_from_nothing(
        ipshell) -> None:

    fake, ctl, mem, inventory = machine("visible 0", start="imported")
    recorder = recording_with(ipshell, mem)
    ipshell.user_ns.update(mem=mem, fake=fake, GIB=GIB)
    run(ipshell, "x = 1")
    assert mem.calls == [] and list(recorder.cells) == []  # FakeMemory refuses any call before initialization
    count = run(ipshell, "fake.initialize(); mem.allocate('GPU:0', 2 * GIB)")
    (cell,) = recorder.cells
    assert (cell.execution_count, cell.devices) == (count, {"GPU:0": (0, 2 * GIB, 2 * GIB)})
    assert len(ours(ipshell)) == 2


def test_with_no_gpu_in_tensorflows_runtime_no_hook_stays(ipshell) -> None:
    """A CPU build (or no card): once initialized TensorFlow lists no logical GPU, and the pair goes."""
    from tfgpu_magic.views.figures import memory_result

    fake, ctl, mem, inventory = machine(inventory=Inventory(error="NVML unavailable"), env={"CUDA_VISIBLE_DEVICES": ""},
                                        start="initialized")
    assert mem.logical_gpus() == []
    recorder = recording_with(ipshell, mem)
    assert len(ours(ipshell)) == 2
    run(ipshell, "y = 2")
    assert ours(ipshell) == [] and list(recorder.cells) == [] and not recorder.recording
    assert memory_result(ctl, ipshell, mem, inventory).text() == memory_text(ctl, mem, inventory)


def test_a_broken_reading_stops_the_record_instead_of_an_error_under_every_cell(ipshell, capsys) -> None:

    fake, ctl, mem, inventory = machine("visible 0", start="initialized")

    def broken(device: str) -> None:
        raise RuntimeError("driver gone")

    mem.info = broken
    recording_with(ipshell, mem)
    run(ipshell, "z = 3")
    assert ours(ipshell) == [] and "driver gone" not in capsys.readouterr().err


def test_tensorflows_import_starts_the_record_and_the_oom_note_then_calls_the_peak_the_cells(ipshell) -> None:
    """`tf.cellhooks.on_tensorflow_import` (what the import hook's callback runs) starts the recorder; while
    it resets the peaks before each cell, an OOM note speaks of the cell's peak, not the peak so far."""
    from tfgpu_magic.tf import cellhooks, initcell, oom

    fake, ctl, mem, inventory = machine("visible 0")
    try:
        cellhooks.on_tensorflow_import(ctl, ipshell)
        assert cellmemory.recording(ipshell) and len(ours(ipshell)) == 2
        assert getattr(ipshell, "_tfgpu_oom_hook").peak_from_cell() is True
        cellmemory.recorder(ipshell).stop()
        assert getattr(ipshell, "_tfgpu_oom_hook").peak_from_cell() is False
        cellmemory.peaks_per_cell(ipshell, True)  # `%tfgpu watch on` resets them where the recorder stopped
        assert getattr(ipshell, "_tfgpu_oom_hook").peak_from_cell() is True
        cellmemory.peaks_per_cell(ipshell, False)
        recording_with(ipshell, mem)  # another recorder on the shell: the hook reads the one there now
        assert getattr(ipshell, "_tfgpu_oom_hook").peak_from_cell() is True
    finally:
        oom.uninstall(ipshell)
        watch = getattr(ipshell, "_tfgpu_init_watch", None)
        if watch is not None:
            watch.stop()
        initcell.forget()


@pytest.mark.tensorflow
def test_a_real_kernel_with_cpu_tensorflow_keeps_no_hook_and_shows_memory_as_text_and_html() -> None:
    """Real TensorFlow (CPU build) in a real kernel: the recorder starts at the import and goes once the
    runtime lists no GPU; `%tfgpu memory` is one display, text/plain and text/html together."""
    from kernels import running_kernel

    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        kernel.ok("import tensorflow as tf")
        assert kernel.evaluate("__import__('tfgpu_magic.tf.cellmemory').tf.cellmemory.recording(get_ipython())") is True
        kernel.ok("tf.constant(1)")
        assert kernel.evaluate("__import__('tfgpu_magic.tf.cellmemory').tf.cellmemory.recording(get_ipython())") is False
        shown = kernel.ok("%tfgpu memory")
        assert shown.stdout == "" and len(shown.results) == len(shown.html) == 1
        assert shown.results[0].startswith("No GPU") and "<svg" not in shown.html[0]

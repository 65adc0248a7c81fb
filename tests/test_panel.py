"""The widget panel at the Python level: widget state, clicks, two-way sync with the controller,
locking once TensorFlow is initialized, and the magic's one-line errors for invalid input.

GPU rows come from a fake NVML (the inventory's one chokepoint) and TensorFlow's rules from the fake
`tf.config` seam; TensorFlow itself is never imported here.
"""

from __future__ import annotations

import html
import os
import sys
from types import SimpleNamespace

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF

from tfgpu_magic.tf import quietimport
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.language.sizes import gib_pair
from tfgpu_magic.views.panel import COLUMNS, YOU_COLOR, ListedGpu, Panel, memory_bar, refresh_open_panels, show_panel


@pytest.fixture(autouse=True)
def _disarm_hook():
    yield
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


def make_panel(tf: FakeTF | None = None, gpus: bool = True) -> tuple[Panel, Controller]:
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus()))) if gpus else Inventory(error="no NVML here")
    controller = Controller(api=tf or FakeTF(4, imported=False), environ={}, catalog=InventoryCatalog(inventory))
    return Panel(controller), controller


def test_one_row_per_gpu_with_memory_bar():
    """Each NVML GPU gets a row whose bar shows used/total in GiB (exact MiB in the tooltip), this
    kernel's share (the fake lists this process on GPU 0) in its own segment."""
    panel, _ = make_panel()
    assert sorted(panel.visible) == ["0", "1", "2", "3"]
    bar = panel.bars["0"].value
    assert "20.0 / 80 GiB" in bar and "20,480 of 81,920 MiB used" in bar
    assert f"width:1.2%;min-width:3px;height:100%;background:{YOU_COLOR}" in bar and "width:23.8%" in bar
    assert "0.0 / 40 GiB" in panel.bars["3"].value
    assert all(box.value for box in panel.visible.values())


def test_gib_pair_reads_like_a_card():
    """Whole-GiB cards show no decimals; odd sizes one; cards under 1 GiB stay in MiB."""
    assert gib_pair(20480, 81920) == "20.0 / 80 GiB"
    assert gib_pair(1229, 16128) == "1.2 / 15.8 GiB"
    assert gib_pair(100, 512) == "100 / 512 MiB"


def test_rows_show_utilization_processes_and_this_kernels_share():
    """From the fake NVML: GPU 0 is 50% busy, held by this kernel (1 GiB, marked "you") and one
    other process; GPU 1 has none; GPU 3 (MIG, NVML gives no utilization) shows a dash and its
    two MIG instances."""
    panel, _ = make_panel()
    assert ">50%</div>" in panel.busy["0"].value and ">30%</div>" in panel.busy["1"].value
    assert "title='50% busy (NVML" in panel.busy["0"].value
    holders = panel.holders["0"].value
    assert ">you: 1.0 GiB</b> · 1 other: 19.0 GiB" in holders and f"pid {os.getpid()} (this kernel)" in holders
    assert "no processes" in panel.holders["1"].value and "you:" not in panel.holders["1"].value
    assert "utilization unknown" in panel.busy["3"].value
    cells = panel.table.children
    assert len(cells) == len(COLUMNS) * 5  # one grid: a header row and one row per card
    cards = [cell.value for cell in cells if "A100" in str(cell.value)]
    assert len(cards) == 4 and "MIG ×2" in cards[3] and ">A100-SXM4-80GB<" in cards[0]
    assert [cells[len(COLUMNS) * row] for row in range(1, 5)] == [panel.visible[ref] for ref in "0123"]
    assert panel.visible["3"].description == "<b>GPU 3</b>" and panel.visible["3"].description_allow_html


def test_other_kernels_share_is_not_yours():
    """With only other processes on GPU 0 (the fake's `this_kernel=False`), nothing says "you"."""
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    panel = Panel(Controller(api=FakeTF(4, imported=False), environ={}, catalog=InventoryCatalog(inventory)))
    assert "you:" not in panel.holders["0"].value and "2 others: 20.0 GiB" in panel.holders["0"].value
    assert YOU_COLOR not in panel.bars["0"].value


def test_cpu_devices_default_reads_tf_default():
    """No CPU split shows an empty field reading "TF default" (not 0); a number splits; clearing
    it goes back to TensorFlow's default; a bad count gives the grammar's message."""
    panel, ctl = make_panel()
    assert panel.cpus.value == "" and panel.cpus.placeholder == "TF default"
    panel.cpus.value = "2"
    assert ctl.policy.cpu_devices == 2
    panel.cpus.value = ""
    assert ctl.policy.cpu_devices is None
    panel.cpus.value = "many"
    assert panel.error.value and ctl.policy.cpu_devices is None and panel.cpus.value == ""


def test_no_gpu_says_why():
    """Without GPUs the panel shows one line with the inventory's reason and the doctor hint."""
    panel, _ = make_panel(gpus=False)
    assert panel.visible == {}
    assert "no NVML here" in panel.no_gpu_reason and "%tfgpu doctor" in panel.no_gpu_reason
    assert "<code>%tfgpu doctor</code>" in panel.table.value and "`" not in panel.table.value  # code, not backticks


def test_panel_edits_reach_the_policy():
    """Growth, allocator, CPU devices, visibility, limit and split edits become the policy."""
    panel, ctl = make_panel()
    panel.growth.value = "on"
    panel.allocator.value = "async"
    panel.cpus.value = "3"
    panel.visible["3"].value = False
    panel.limits["0"].value = "2GB"
    panel.splits["1"].value = "2x1GB"
    policy = ctl.policy
    assert policy.growth is True and policy.allocator == "async" and policy.cpu_devices == 3
    assert policy.visible == ("0", "1", "2")
    assert policy.limit_map == {"0": 2048} and policy.split_map == {"1": (1024, 1024)}
    assert ctl.environ["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"


def test_default_choice_clears_the_field_through_the_edit_path(monkeypatch: pytest.MonkeyPatch):
    """Choosing 'TF default' again removes growth or the allocator from the policy, as an edit
    through `Controller.edit` (validated and applied like the magic's), never a bypass."""
    panel, ctl = make_panel()
    panel.growth.value = "off"
    panel.allocator.value = "async"
    edits = []
    real = ctl.edit
    monkeypatch.setattr(ctl, "edit", lambda batch: edits.extend(batch) or real(batch))
    panel.growth.value = "default"
    panel.allocator.value = "default"
    assert ctl.policy.growth is None and ctl.policy.allocator is None
    assert [edit.name for edit in edits] == ["growth", "allocator"]
    assert "TF_GPU_ALLOCATOR" not in ctl.environ


def test_loglevel_dropdown():
    """The log level is one more dropdown over the same policy; 'TF default' is `loglevel off`."""
    panel, ctl = make_panel()
    panel.loglevel.value = "error"
    assert ctl.policy.loglevel == "error"
    ctl.edit([ctl.parse("loglevel info")])
    assert panel.loglevel.value == "info"
    panel.loglevel.value = "off"
    assert ctl.policy.loglevel is None


def test_magic_edits_show_in_the_panel():
    """An edit through the controller (what the magic does) updates every open panel."""
    first, ctl = make_panel()
    second = Panel(ctl)
    ctl.edit([ctl.parse("growth on"), ctl.parse("split cpu 2"), ctl.parse("limit 3GB 2"), ctl.parse("visible 0,2")])
    for panel in (first, second):
        assert panel.growth.value == "on" and panel.cpus.value == "2"
        assert panel.limits["2"].value == "3GB"
        assert [ref for ref, box in panel.visible.items() if box.value] == ["0", "2"]


def test_invalid_input_gives_the_magic_message_and_changes_nothing():
    """A bad limit shows the grammar's one-line message, reverts the field, leaves the policy."""
    panel, ctl = make_panel()
    panel.limits["0"].value = "2GB"
    before = ctl.policy
    panel.limits["0"].value = "lots"
    assert "not a size: 'lots'" in html.unescape(panel.error.value)
    assert ctl.policy == before and panel.limits["0"].value == "2GB"
    panel.splits["0"].value = "2x1GB"  # contradicts the limit on GPU 0
    assert "both a limit and a split" in panel.error.value and panel.splits["0"].value == ""
    panel.limits["0"].value = "<b>2GB"
    assert "&lt;b&gt;" in panel.error.value and "<b>" not in panel.error.value  # shown, never rendered
    panel.cpus.value = "2"
    assert panel.error.value == ""


def test_reset_and_export_buttons():
    """Reset empties the policy and every control; Export shows the equivalent code."""
    panel, ctl = make_panel()
    panel.cpus.value = "2"
    panel.export_button.click()
    assert "LogicalDeviceConfiguration()] * 2" in panel.message
    panel.reset_button.click()
    assert ctl.policy.is_empty and panel.cpus.value == "" and panel.growth.value == "default"


def test_apply_button_applies_once_tensorflow_is_imported():
    """Apply is off before import (the hook applies), on after import, and applies the policy."""
    tf = FakeTF(2, imported=False)
    panel, ctl = make_panel(tf)
    panel.cpus.value = "2"
    assert panel.apply_button.disabled
    tf.imported = True
    panel.sync()
    assert not panel.apply_button.disabled
    panel.apply_button.click()
    assert tf.get_logical(tf.devices("CPU")[0]) == (None, None)


def test_locked_after_initialization_with_reason_and_pending():
    """Once initialized: Apply disabled, controls marked locked with the reason, edits pending."""
    tf = FakeTF(2)
    panel, ctl = make_panel(tf)
    panel.cpus.value = "2"
    tf.initialize()
    panel.sync()
    assert panel.apply_button.disabled and "restart" in panel.apply_button.tooltip
    assert "locked" in panel.header.value and "Restart kernel and apply" in panel.cpus.tooltip
    panel.cpus.value = "3"
    assert "Pending, needs a restart" in panel.header.value and "3 logical devices" in panel.header.value
    assert "initialized" in panel.header.value


def test_restart_needs_a_confirmation():
    """The restart button only asks; the confirm button calls the restart once."""
    calls = []
    tf = FakeTF(2)
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    ctl = Controller(api=tf, environ={}, catalog=InventoryCatalog(inventory))
    panel = Panel(ctl, restart=lambda: calls.append(1) or "Restarting")
    panel.restart_button.click()
    assert calls == [] and panel.confirm_button.layout.display == ""
    panel.cancel_button.click()
    assert calls == [] and panel.confirm_button.layout.display == "none"
    panel.restart_button.click()
    panel.confirm_button.click()
    assert calls == [1] and panel.message == "Restarting"


def test_live_refresh_runs_only_while_on_and_stops_on_close():
    """No thread while live memory is off; one while on; none after close."""
    panel, ctl = make_panel()
    assert panel._refresher is None
    panel.live.value = True
    assert panel._refresher is not None and panel._refresher.is_alive()
    thread = panel._refresher
    panel.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and panel._refresher is None
    assert ctl.listeners == []


def test_rows_of_controls_wrap_rather_than_cut_labels():
    """In a narrow notebook the rows of controls wrap onto another line instead of squeezing their
    members: no button or checkbox there may shrink (its label would read "Ap…"). Without a browser
    this is only the layout asked for; tests/test_browser.py measures the rendered panel."""
    panel, _ = make_panel()
    controls, buttons = panel.widget.children[2:4]
    assert {panel.growth, panel.cpus} <= set(controls.children) and panel.apply_button in buttons.children
    assert controls.layout.flex_flow == buttons.layout.flex_flow == "row wrap"
    assert all(member.layout.flex == "0 0 auto" for member in buttons.children)


def test_memory_bar_unknown():
    """A GPU without memory figures says so instead of drawing a bar."""
    assert "unknown" in memory_bar(ListedGpu("0", "GPU"))
    assert "width:50.0%" in memory_bar(ListedGpu("0", "GPU", used_mib=512, total_mib=1024))


def test_panel_edit_shows_in_status_and_export():
    """What the panel sets is what `%tfgpu` status and `export` show."""
    from tfgpu_magic.tf.export import export
    from tfgpu_magic.views.status import describe_status

    panel, ctl = make_panel()
    panel.cpus.value = "2"
    panel.limits["1"].value = "1.5GB"
    status = describe_status(ctl)
    assert "split cpu into 2 logical devices" in status and "limit 1536MB on GPU 1" in status
    code = export(ctl.policy)
    assert "LogicalDeviceConfiguration()] * 2" in code and "memory_limits = {1: [1536]}" in code


def test_in_a_granted_kernel_a_row_edits_its_own_card():
    """Started with `CUDA_VISIBLE_DEVICES=2` (PCI order), where `limit 2GB 2` would mean the grant's GPU 2:
    the row of nvidia-smi's GPU 2 names its card by UUID, and the row of a card outside the grant gets the
    magic's one-line refusal."""
    from fake_nvml import UUIDS

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    env = {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    ctl = Controller(api=FakeTF(4, imported=False, environ=env), environ=env, catalog=InventoryCatalog(inventory))
    panel = Panel(ctl)
    panel.limits["2"].value = "2GB"
    assert ctl.policy.limits == ((UUIDS[2], 2048),) and panel.error.value == ""
    panel.limits["1"].value = "1GB"
    assert "this kernel was granted 1 GPU (CUDA_VISIBLE_DEVICES=2), and this GPU is not among them" in panel.error.value
    assert ctl.policy.limits == ((UUIDS[2], 2048),) and panel.limits["1"].value == ""


def test_panel_in_terminal_ipython_needs_a_notebook(capsys):
    """`%tfgpu panel` in terminal IPython says it needs a notebook front end, and builds nothing."""
    from IPython.testing.globalipapp import get_ipython

    from tfgpu_magic.views.magics import TFGPUMagics

    shell = get_ipython()
    previous = shell.magics_manager.registry.get("TFGPUMagics")
    shell.register_magics(TFGPUMagics(shell, controller=Controller(environ={})))
    try:
        shell.run_line_magic("tfgpu", "panel")
    finally:
        if previous is not None:
            shell.register_magics(previous)
    assert "needs a notebook front end" in capsys.readouterr().out


def test_policies_naming_gpus_by_uuid_show_on_their_rows():
    """`visible auto:2` pins UUIDs; a limit by UUID and an all-GPU limit show on the right rows,
    and a split GPU does not show the all-GPU limit (it does not apply there)."""
    panel, ctl = make_panel()
    uuids = {gpu.ref: gpu.uuid for gpu in ctl.inventory().gpus}
    ctl.edit([ctl.parse("visible auto:2")])
    picked = {ref for ref, uuid in uuids.items() if uuid in ctl.policy.visible}
    assert {ref for ref, box in panel.visible.items() if box.value} == picked and len(picked) == 2
    ctl.edit([ctl.parse("visible all"), ctl.parse("limit 1GB"), ctl.parse(f"limit 3GB {uuids['2']}"),
              ctl.parse("split 1 2x1GB")])
    assert panel.limits["2"].value == "3GB" and panel.limits["0"].value == "1GB"
    assert panel.limits["1"].value == "" and panel.splits["1"].value == "2x1GB"


def test_where_nothing_restarts_the_button_keeps_the_policy_without_asking():
    """Under nbclient or VS Code nothing brings a kernel back: the button says it keeps the policy for
    the front end's restart, and pressing it stores it at once (no "variables are lost" step)."""
    calls = []
    panel = Panel(Controller(api=FakeTF(2), environ={}), restart=lambda: calls.append(1) or "Not restarted: stored",
                  restarts=False)
    assert panel.restart_button.description == "Keep for the next restart"
    assert "front end" in panel.restart_button.tooltip
    panel.restart_button.click()
    assert calls == [1] and panel.confirm_button.layout.display == "none"
    assert panel.message == "Not restarted: stored"


def test_who_section_reads_only_when_opened():
    """"Who holds the GPUs" is closed at first and reads nothing; opening it shows the `who` text
    (escaped), and it is hidden where no `who` is given."""
    calls = []
    panel = Panel(Controller(api=FakeTF(2), environ={}), who=lambda: calls.append(1) or "GPU 0 <you>")
    assert calls == [] and panel.who_section.selected_index is None
    panel.who_section.selected_index = 0
    assert calls == [1] and "GPU 0 &lt;you&gt;" in panel.who_text.value
    assert Panel(Controller(api=FakeTF(2), environ={})).who_section.layout.display == "none"


def test_panel_as_a_cells_value_adds_nothing_in_its_own_cell(monkeypatch: pytest.MonkeyPatch):
    """`tfgpu_magic.panel()` last in a cell: the panel is already shown, so echoing it displays
    nothing (no `<Panel at 0x…>`); echoed in a later cell it shows its widget again."""
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *values: shown.extend(values))
    shell = SimpleNamespace(execution_count=4, events=SimpleNamespace(register=lambda *a: None,
                                                                      unregister=lambda *a: None))
    monkeypatch.setattr("tfgpu_magic.views.panel._open_panels", [])
    panel = show_panel(Controller(api=FakeTF(2), environ={}), shell, None, restarts=False)
    try:
        assert shown == [panel.widget]
        panel._ipython_display_()
        assert shown == [panel.widget]
        shell.execution_count = 5
        panel._ipython_display_()
        assert shown == [panel.widget, panel.widget]
    finally:
        panel.close()


def test_live_memory_shows_tensorflows_figures_under_the_table():
    """With live memory ticked, `%tfgpu memory`'s figures (here the cap, before initialization) are
    listed under the table, one line per GPU, leaving the rows one line each."""
    panel, ctl = make_panel()
    ctl.edit([ctl.parse("limit 2GB 0")])
    assert panel.figures.value == ""
    panel.live.value = True
    try:
        panel.refresh_memory()
        assert "GPU 0: cap" in panel.figures.value and "2.0 GiB" in panel.figures.value
        assert "cap" not in panel.bars["0"].value
    finally:
        panel.close()


def test_rows_follow_the_gpus_after_each_cell(monkeypatch: pytest.MonkeyPatch):
    """After a cell (the post_run_cell hook) the rows re-read NVML: here the fake now lists this
    kernel on GPU 1 with 2 GiB, as after a cell that initialized TensorFlow there."""
    panel, ctl = make_panel()
    gpus = four_gpus(this_kernel=False)
    gpus[1].processes, gpus[1].used_mib = [(os.getpid(), 2048)], 2048
    monkeypatch.setattr(ctl, "inventory", lambda: read_inventory(Nvml(module=FakeNvml(gpus))))
    monkeypatch.setattr("tfgpu_magic.views.panel._open_panels", [panel])
    assert "you:" not in panel.holders["1"].value
    refresh_open_panels()
    assert ">you: 2.0 GiB</b>" in panel.holders["1"].value and "2.0 / 80 GiB" in panel.bars["1"].value
    assert "you:" not in panel.holders["0"].value

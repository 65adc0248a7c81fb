"""The actions beside the controller, and the results they return: one text form for terminals and
logs, one HTML form for notebooks, both from one snapshot. TensorFlow goes through tests/fake_tf.py,
NVML through tests/fake_nvml.py; the shell is IPython's real display machinery."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_nvml import OTHER_PID, FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.formatters import DisplayFormatter

from tfgpu_magic.views import actions
from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic import doctor
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.language import directives
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views import results
from tfgpu_magic.views.status import no_gpu_reason


@pytest.fixture(autouse=True)
def _disarm_hook():
    yield
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


def make_controller(tf: FakeTF | None = None, gpus: bool = True) -> Controller:
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus()))) if gpus else Inventory(error="no NVML here")
    return Controller(api=tf or FakeTF(4, imported=False), environ={}, catalog=InventoryCatalog(inventory))


def formats(value: object) -> dict[str, str]:
    """What IPython's display machinery sends for `value` (text/plain, text/html, ...)."""
    data, _ = DisplayFormatter().format(value)
    return data


def test_every_action_directive_has_one_action():
    """The registry's action directives and the actions are the same set, so dispatch never misses."""
    assert set(actions.ACTIONS) == set(directives.ACTIONS)
    with pytest.raises(PolicyError, match="`grow` is not an action"):
        actions.run("grow", make_controller(), None)


@pytest.mark.usefixtures("tensorflow_alone")
def test_status_is_one_result_with_text_and_html():
    """The status text is the old text (the fake's four cards, this process on GPU 0), and a notebook
    gets an HTML table alongside it."""
    ctl = make_controller()
    ctl.edit([ctl.parse("growth on"), ctl.parse("limit 2GB 0")])
    result = actions.status(ctl)
    sent = formats(result)
    assert sent["text/plain"] == str(result) == f"""\
TensorFlow: not imported
Policy:     growth on; limit 2GB on GPU 0
Variables:  CUDA_DEVICE_ORDER=PCI_BUS_ID, TF_FORCE_GPU_ALLOW_GROWTH=true
GPUs (NVML, driver 550.54.15, nvidia-smi numbering):
  0  NVIDIA A100-SXM4-80GB  20.0 / 80 GiB used, 50% busy  GPU-0a6f8c2e…  bus 00000000:07:00.0
       pid {os.getpid()}: 1.0 GiB (this kernel)
       pid {OTHER_PID}: 19.0 GiB
  1  NVIDIA A100-SXM4-80GB  1.0 / 80 GiB used, 30% busy  GPU-b1c2d3e4…  bus 00000000:0F:00.0
  2  NVIDIA A100-SXM4-80GB  1.0 / 80 GiB used, 10% busy  GPU-b2d4f6a8…  bus 00000000:47:00.0
  3  NVIDIA A100-SXM4-40GB  0.0 / 40 GiB used  GPU-c3e5a7b9…  bus 00000000:4E:00.0
       MIG MIG-5e6f7a8b-9c0d-5e1f-a2b3-c4d5e6f7a8b9  19.5 GiB
       MIG MIG-7a8b9c0d-1e2f-5a3b-c4d5-e6f7a8b9c0d1  9.6 GiB
Note: growth goes through TF_FORCE_GPU_ALLOW_GROWTH=true: TF refuses set_memory_growth on a limited
      GPU"""
    html = sent["text/html"]
    assert "<table" in html and "growth on; limit 2GB on GPU 0" in html
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in html and "NVIDIA A100" in html
    assert "var(--jp-success-color1" in html and "locked" not in html


def test_status_html_marks_locked_settings_and_pending_changes():
    tf = FakeTF(2)
    ctl = make_controller(tf)
    ctl.edit([ctl.parse("split cpu 2")])
    tf.initialize()
    ctl.edit([ctl.parse("split cpu 3")])
    result = actions.status(ctl)
    html = result.html()
    assert result.snapshot.locked and ">locked</span>" in html and "var(--jp-warn-color1" in html
    assert "Pending, needs a restart" in html and "3 logical devices" in html
    assert "Pending, needs a restart:\n  - " in result.text()


def test_html_escapes_what_the_environment_holds():
    ctl = make_controller(gpus=False)
    ctl.environ["CUDA_VISIBLE_DEVICES"] = "<b>0</b>"
    html = actions.status(ctl).html()
    assert "<b>0</b>" not in html and "&lt;b&gt;0&lt;/b&gt;" in html


DOCTOR_REPORT = """\
[FAIL] NVIDIA driver / NVML: no NVML here
       fix: install the NVIDIA driver on the host (nvidia-smi must work), or start the container with GPUs (--gpus all)
[FAIL] device nodes: no /dev/nvidia0, /dev/nvidia1, ... in this machine or container
       fix: no GPU is attached here; in Docker start with --gpus all (NVIDIA Container Toolkit), in Kubernetes request nvidia.com/gpu
[FAIL] TensorFlow: not installed for this kernel's Python (/opt/conda/bin/python3)
       fix: /opt/conda/bin/python3 -m pip install tensorflow
[  ok] Python: the kernel runs /opt/conda/bin/python3, the same as `python3` on PATH
[  ok] CUDA_VISIBLE_DEVICES: not set: every GPU is visible
[  ok] CUDA_DEVICE_ORDER: PCI_BUS_ID: TensorFlow's GPU numbers match nvidia-smi's
[info] TensorFlow's GPUs: not listed yet (listing starts CUDA, after which CUDA_* settings are too late)
       fix: run `tf.config.list_physical_devices('GPU')` after your policy, then doctor again

TensorFlow has no GPU here because: NVIDIA driver / NVML: no NVML here; device nodes: no /dev/nvidia0, \
/dev/nvidia1, ... in this machine or container; TensorFlow: not installed for this kernel's Python \
(/opt/conda/bin/python3). Fix the first one first. `%tfgpu selftest` (in a terminal: `python -m tfgpu_magic \
selftest`) proves, in fresh processes, that each setting of the policy takes effect here."""
"""The doctor on the controller's facts (no NVML, CUDA_DEVICE_ORDER set) and a fixed machine: no device
nodes, no TensorFlow."""


def test_doctor_result_text_is_the_report_and_html_colours_verdicts(monkeypatch: pytest.MonkeyPatch):
    """The machine's own facts are fixed (any machine gives the same report); the controller's
    environment, inventory, policy and TensorFlow are what the doctor inspects."""
    ctl = make_controller(gpus=False)
    ctl.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    inspected: list[tuple] = []

    def fixed_machine(environ, inventory, policy, api, nvml=None) -> doctor.Machine:
        inspected.append((environ, inventory, policy, api))
        return doctor.Machine(environ, inventory, policy, api, tf_dir=None, tf_distribution=None, device_nodes=(),
                              python="/opt/conda/bin/python3", path_python="/opt/conda/bin/python3",
                              path_python_has_tf=True)

    monkeypatch.setattr(doctor, "inspect_machine", fixed_machine)
    result = actions.doctor(ctl)
    assert len(inspected) == 1 and all(a is b for a, b in zip(inspected[0], (ctl.environ, ctl.inventory(), ctl.policy,
                                                                          ctl.api)))
    assert str(result) == formats(result)["text/plain"] == DOCTOR_REPORT
    html = formats(result)["text/html"]
    assert html.count("color:var(--jp-error-color1, #d32f2f);font-weight:bold'>FAIL</td>") == 3
    assert html.count("color:var(--jp-success-color1, #388e3c);font-weight:bold'>ok</td>") == 3
    assert "<th style='text-align:left;vertical-align:top;padding:1px 8px 1px 0'>NVIDIA driver / NVML</th>" in html
    assert "Fix the first one first.</p></div>" in html


def test_show_prints_text_and_publishes_results(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """Text is printed (nothing for ''); a result is published as text/plain + text/html where an
    IPython shell with a rich front end runs (a kernel's publisher, `capture_output`'s), and printed
    as text where none does (a script) or where the publisher is terminal IPython's (text only)."""
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class RichPublisher(DisplayPublisher):
        """Stands for ipykernel's ZMQDisplayPublisher: any publisher but the terminal's own."""

    result = actions.status(make_controller())
    published: list[dict] = []
    monkeypatch.setattr("IPython.display.publish_display_data", published.append)
    monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: False))
    results.show("")
    results.show("Applied: x")
    results.show(result)
    assert capsys.readouterr().out == f"Applied: x\n{result.text()}\n" and published == []
    shell = SimpleNamespace(display_pub=DisplayPublisher())  # not a second shell singleton in this process
    monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: True))
    monkeypatch.setattr(InteractiveShell, "instance", classmethod(lambda cls, *args, **kwargs: shell))
    results.show(result)
    assert capsys.readouterr().out == f"{result.text()}\n" and published == []
    shell.display_pub = RichPublisher()
    results.show(result)
    assert published == [{"text/plain": result.text(), "text/html": result.html()}]
    assert capsys.readouterr().out == ""


def test_export_is_the_controllers_export():
    """The controller's policy in the format asked for (python by default), without the final newline."""
    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    assert actions.export(ctl, None, "json") == (
        '{\n  "visible": null,\n  "growth": null,\n  "limits": {},\n  "splits": {},\n  "cpu_devices": 2,\n'
        '  "allocator": null,\n  "loglevel": null\n}')
    assert actions.export(ctl) == (
        "# GPU policy exported by tfgpu_magic; run it before anything else touches TensorFlow.\n\n"
        "import tensorflow as tf\n\n"
        'cpus = tf.config.list_physical_devices("CPU")\n'
        "tf.config.set_logical_device_configuration(\n"
        "    cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2\n"
        ")")


def test_restart_offer_where_a_restart_is_possible(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Without --yes, a route that restarts gets an offer: what is lost, and a button that restarts
    once (here a stand-in that records the call)."""
    from tfgpu_magic.jupyter import restart

    monkeypatch.setattr(restart, "choose_route", lambda shell: restart.Route("server"))
    asked: list[int | None] = []
    monkeypatch.setattr(restart, "restart_and_apply", lambda shell, policy, refused: (
        asked.append(policy.cpu_devices), restart.Restarting(restart.Route("exit")))[1])
    said = "Restarting the kernel: it exits now and its manager starts it again; the policy will be in force before your next cell."
    buttons: list = []
    monkeypatch.setattr("tfgpu_magic.views.confirm.show_restart_button", buttons.append)
    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    offer = actions.restart(ctl, SimpleNamespace(kernel=object()))
    assert isinstance(offer, results.RestartOffer)
    assert str(offer).startswith("Restarting loses every variable of this kernel.")
    offer._ipython_display_()
    assert capsys.readouterr().out == str(offer) + "\n" and len(buttons) == 1
    assert buttons[0]() == said and asked == [2]
    assert actions.restart(ctl, None, yes=True) == said and asked == [2, 2]


def test_default_and_autoload_in_a_profile(tmp_path: Path):
    shell = SimpleNamespace(profile_dir=SimpleNamespace(location=str(tmp_path)))
    ctl = make_controller()
    ctl.edit([ctl.parse("growth on")])
    assert actions.run("default", ctl, shell, "save").startswith("Saved as the default policy")
    assert actions.default(ctl, shell, "show").endswith("): growth on")
    assert "removed" in actions.default(ctl, shell, "clear")
    assert actions.default(ctl, shell, None).startswith("No default policy saved")


def test_panel_needs_a_kernel():
    assert actions.panel(make_controller(), SimpleNamespace()).startswith("The panel needs a notebook front end")


# ----- the controller's public surface for views -------------------------------------------------
def test_gpu_settings_work_out_limit_and_split_precedence():
    """A limit without GPUs applies to every GPU without a split; a GPU's own limit wins; a UUID
    entry lands on its index."""
    ctl = make_controller()
    uuid = read_inventory(Nvml(module=FakeNvml(four_gpus()))).gpus[2].uuid
    ctl.edit([ctl.parse("limit 1GB"), ctl.parse("split 1 2x1GB"), ctl.parse(f"limit 3GB {uuid}"),
              ctl.parse("visible 0,1,2")])
    got = ctl.gpu_settings(["0", "1", "2", "3"])
    assert [(g.visible, g.limit_mib, g.split) for g in got.values()] == [
        (True, 1024, None), (True, None, (1024, 1024)), (True, 3072, None), (False, 1024, None)]


def test_gpus_come_from_tensorflow_without_nvml():
    ctl = make_controller(FakeTF(2), gpus=False)
    rows, reason = ctl.gpus()
    assert [row.ref for row in rows] == ["0", "1"] and reason is None
    rows, reason = make_controller(FakeTF(0, imported=False), gpus=False).gpus()
    assert rows == [] and no_gpu_reason(reason).startswith("No GPU found: no NVML here")


def test_subscribe_and_unsubscribe():
    ctl = make_controller()
    seen: list[Controller] = []
    ctl.subscribe(seen.append)
    ctl.edit([ctl.parse("growth on")])
    ctl.unsubscribe(seen.append)
    ctl.unsubscribe(seen.append)  # twice is harmless
    ctl.edit([ctl.parse("growth off")])
    assert seen == [ctl]


def test_environment_lists_only_our_variables():
    """Our variables only; and an inherited grant by index keeps CUDA's order (PCI_BUS_ID would make
    CUDA read the `1` as another card)."""
    ctl = make_controller()
    ctl.environ.update({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"})
    ctl.edit([ctl.parse("growth on")])
    assert ctl.environment() == {"CUDA_VISIBLE_DEVICES": "1"}
    ctl.environ["CUDA_VISIBLE_DEVICES"] = "GPU-b1c2d3e4"
    ctl.edit([ctl.parse("growth on")])
    assert ctl.environment() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-b1c2d3e4"}


def test_a_kernel_gets_status_and_doctor_as_text_and_html():
    """In a real kernel the status and the doctor arrive as one display each, text/plain and
    text/html together, and nothing of them on stdout; edits still print."""
    from kernels import running_kernel

    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        edit = kernel.ok("%tfgpu split cpu 2")
        assert edit.stdout.startswith("Recorded") and edit.results == []
        status = kernel.ok("%tfgpu")
        assert status.stdout == "" and len(status.results) == len(status.html) == 1
        assert status.results[0].startswith("TensorFlow: not imported\nPolicy:     split cpu into 2 logical devices")
        assert "<table" in status.html[0] and "split cpu into 2 logical devices" in status.html[0]
        checks = kernel.ok("%tfgpu doctor")
        assert checks.stdout == "" and "[FAIL] TensorFlow build" in checks.results[0]  # in whatever order it checks
        assert "var(--jp-error-color1" in checks.html[0]
        assert kernel.loaded_modules("tensorflow", "ipywidgets") == set()


@pytest.mark.parametrize("route, label, clicks", [
    ("frontend", "Keep for the next restart", ("restart_button",)),
    ("server", "Restart kernel and apply", ("restart_button", "confirm_button")),
], ids=["stores-only", "restarts-after-confirm"])
def test_the_panel_gets_the_same_restart_from_magic_and_python(monkeypatch: pytest.MonkeyPatch, route: str, label: str,
                                                               clicks: tuple[str, ...]):
    """`%tfgpu panel` and `tfgpu_magic.panel()` both open the panel through `actions.open_panel`:
    its restart button stores the policy and restarts by the route `choose_route` picks (a route that
    restarts asks first; one that cannot stores at once)."""
    import tfgpu_magic
    from tfgpu_magic.jupyter import restart

    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    opened: list[tuple] = []
    open_panel = actions.open_panel

    def recorded(*args: Any) -> Any:
        opened.append(args)
        return open_panel(*args)

    monkeypatch.setattr(actions, "open_panel", recorded)
    monkeypatch.setattr(restart, "choose_route", lambda shell: restart.Route(route))
    restarted: list[tuple] = []
    monkeypatch.setattr(restart, "restart_and_apply", lambda shell, policy, refused: (
        restarted.append((shell, policy)), restart.Restarting(restart.Route(route), not_stored="a test"))[1])
    monkeypatch.setattr("IPython.display.display", lambda *values: None)
    monkeypatch.setattr("tfgpu_magic.get_controller", lambda: ctl)
    monkeypatch.setattr("IPython.get_ipython", lambda: None)  # no shell: no post_run_cell hook to register
    monkeypatch.setattr("tfgpu_magic.views.panel._open_panels", [])
    for panel in (actions.open_panel(ctl, None), tfgpu_magic.panel()):
        try:
            assert panel.restart_button.description == label
            for name in clicks:
                assert restarted == [] and panel.message == ""
                getattr(panel, name).click()
            assert restarted == [(None, ctl.policy)]
            assert panel.message == "Not restarted: could not store the policy for the new kernel: a test"
            restarted.clear()
        finally:
            panel.close()
    assert opened == [(ctl, None), (ctl, None)]
    assert ctl.listeners == []


def test_who_action_lists_holders_and_guards_shutdown():
    """`%tfgpu who` renders the holders table from the controller's inventory (the fake's four cards);
    `--yes` alone is refused, and a shutdown of an unknown kernel says so without a request."""
    text = actions.who(make_controller())
    assert "GPU 0" in text and "GPU 3" in text
    with pytest.raises(PolicyError, match="--yes confirms"):
        actions.who(make_controller(), yes=True)
    assert "GPU memory needs NVML" in actions.who(make_controller(gpus=False))


def test_kernelspec_of_an_auto_pick_asks_the_provisioner_to_pick_again():
    """A policy whose `visible` came from `visible auto:2` is not frozen into the kernelspec: the spec
    names the tfgpu provisioner with `auto:2`, and its fixed policy and environment leave `visible` out."""
    from tfgpu_magic.jupyter.kernelspec import kernel_json

    controller = make_controller()
    policy = controller.edit_policy(["visible auto:2", "growth on"])
    spec = kernel_json(policy)
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == "tfgpu-provisioner"
    assert provisioner["config"]["visible"] == "auto:2"
    assert provisioner["config"]["policy"]["visible"] is None and provisioner["config"]["policy"]["growth"] is True
    assert "CUDA_VISIBLE_DEVICES" not in spec["env"] and "visible auto:2" in spec["display_name"]

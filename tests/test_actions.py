"""The actions beside the controller, and the results they return: one text form for terminals and
logs, one HTML form for notebooks, both from one snapshot. TensorFlow goes through tests/fake_tf.py,
NVML through tests/fake_nvml.py; the shell is IPython's real display machinery."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.formatters import DisplayFormatter

from tfgpu_magic import actions
from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus import doctor
from tfgpu_magic.gpus.inventory import Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.language import directives
from tfgpu_magic.tf import importhook
from tfgpu_magic.tf.export import export
from tfgpu_magic.views import results
from tfgpu_magic.views.status import describe_status


@pytest.fixture(autouse=True)
def _disarm_hook():
    yield
    importhook.disarm()
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


def test_status_is_one_result_with_text_and_html():
    """The status text is the old text, and a notebook gets an HTML table alongside it."""
    ctl = make_controller()
    ctl.edit([ctl.parse("growth on"), ctl.parse("limit 2GB 0")])
    result = actions.status(ctl)
    sent = formats(result)
    assert sent["text/plain"] == str(result) == describe_status(ctl)
    assert str(result).startswith("TensorFlow: not imported\nPolicy:     growth on; limit 2048 MiB on GPU 0")
    html = sent["text/html"]
    assert "<table" in html and "growth on; limit 2048 MiB on GPU 0" in html
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


def test_doctor_result_text_is_the_report_and_html_colours_verdicts(monkeypatch: pytest.MonkeyPatch):
    ctl = make_controller(gpus=False)
    result = actions.doctor(ctl)
    machine = doctor.inspect_machine(ctl.environ, ctl.inventory(), ctl.policy, ctl.api)
    assert str(result) == doctor.report(machine)
    html = formats(result)["text/html"]
    assert "var(--jp-error-color1" in html  # no NVML here: a FAIL
    assert "<th" in html and "NVIDIA driver / NVML" in html and "Fix the first one first." in html


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
    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    assert actions.export(ctl, None, "json") == export(ctl.policy, "json", ctl.export_plan()).rstrip("\n")
    assert "LogicalDeviceConfiguration()] * 2" in actions.export(ctl)


def test_restart_offer_where_a_restart_is_possible(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Without --yes, a route that restarts gets an offer: what is lost, and a button that restarts
    once (here a stand-in that records the call)."""
    from tfgpu_magic.jupyter import restart

    monkeypatch.setattr(restart, "choose_route", lambda shell: restart.Route("server", "test"))
    monkeypatch.setattr(restart, "restart_and_apply", lambda shell, policy: f"restarting with {policy.cpu_devices}")
    buttons: list = []
    monkeypatch.setattr("tfgpu_magic.views.confirm.show_restart_button", buttons.append)
    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    offer = actions.restart(ctl, SimpleNamespace(kernel=object()))
    assert isinstance(offer, results.RestartOffer)
    assert str(offer).startswith("Restarting loses every variable of this kernel.")
    offer._ipython_display_()
    assert capsys.readouterr().out == str(offer) + "\n" and len(buttons) == 1
    assert buttons[0]() == "restarting with 2"
    assert actions.restart(ctl, None, yes=True) == "restarting with 2"


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
    assert [row.ref for row in rows] == ["0", "1"] and reason == ""
    rows, reason = make_controller(FakeTF(0, imported=False), gpus=False).gpus()
    assert rows == [] and reason.startswith("No GPU found: no NVML here")


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
    ctl = make_controller()
    ctl.environ.update({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"})
    ctl.edit([ctl.parse("growth on")])
    assert ctl.environment() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}


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


def test_the_panel_gets_the_same_restart_from_magic_and_python(monkeypatch: pytest.MonkeyPatch):
    """`%tfgpu panel` and `tfgpu_magic.panel()` both open the panel through `actions.open_panel`:
    its restart button stores the policy and restarts by the route `choose_route` picks."""
    import tfgpu_magic
    from tfgpu_magic.jupyter import restart

    ctl = make_controller()
    ctl.edit([ctl.parse("split cpu 2")])
    monkeypatch.setattr(restart, "choose_route", lambda shell: restart.Route("frontend", "test"))
    monkeypatch.setattr(restart, "restart_and_apply", lambda shell, policy: f"stored {policy.cpu_devices}")
    monkeypatch.setattr("IPython.display.display", lambda *values: None)
    monkeypatch.setattr("tfgpu_magic.get_controller", lambda: ctl)
    monkeypatch.setattr("IPython.get_ipython", lambda: None)  # no shell: no post_run_cell hook to register
    monkeypatch.setattr("tfgpu_magic.views.panel._open_panels", [])
    for panel in (actions.open_panel(ctl, None), tfgpu_magic.panel()):
        try:
            assert panel.restart_button.description == "Keep for the next restart"
            panel.restart_button.click()
            assert panel.message == "stored 2"
        finally:
            panel.close()
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

"""One plan per call: a `%tfgpu` status on a real IPython shell builds this process's plan once and hands
it down (the pending changes, the notes and the frameworks' rows read that one), whether or not JAX and
PyTorch are installed: what their import will bring is worked out in that same plan (`Plan.at_import`),
and a variable restore that comes too late is checked against the `CUDA_*` variables a fresh process
would get (`plan.cuda_env`), not against a second plan."""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable, Iterator

import pytest
from fake_tf import FakeTF
from IPython.core.interactiveshell import InteractiveShell

import tfgpu_magic.controller as controller_module
from tfgpu_magic.controller import Controller
from tfgpu_magic.envvars import told_to
from tfgpu_magic.gpus.inventory import Gpu, Inventory, InventoryCatalog
from tfgpu_magic.language.policy import ALL_GPUS, Policy
from tfgpu_magic.plan import AtImport
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.magics import TFGPUMagics

STARTS = ("before import", "imported", "devices listed")
"""Where TensorFlow is when the status runs."""


def session(start: str) -> tuple[FakeTF, Controller]:
    """FakeTF at `start` (four 16 GiB GPUs) and a controller sharing its environment."""
    env: dict[str, str] = {}
    fake = FakeTF(4, imported=start != "before import", environ=env)
    if start == "devices listed":
        fake.list_devices()
    inventory = Inventory(gpus=tuple(Gpu(index, uuid, memory_total_mib=16384) for index, uuid in enumerate(fake.uuids)))
    return fake, Controller(api=fake, environ=env, catalog=InventoryCatalog(inventory))


@pytest.fixture
def magic(shell: InteractiveShell) -> Iterator[Callable[[Controller], None]]:
    """Put `%tfgpu` of the test shell over a given controller; the shell's own magic back after."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    yield lambda controller: shell.register_magics(TFGPUMagics(shell, controller=controller))
    quietimport.disarm()
    shell.register_magics(previous)


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of `Controller.plan` (this process's plan) and of every `build_plan` the controller makes
    (this process's and the fresh process's)."""
    counts = {"plan": 0, "build_plan": 0}
    real_plan, real_build = Controller.plan, controller_module.build_plan

    def plan(self: Controller, *args: Any, **kwargs: Any) -> Any:
        counts["plan"] += 1
        return real_plan(self, *args, **kwargs)

    def build(*args: Any, **kwargs: Any) -> Any:
        counts["build_plan"] += 1
        return real_build(*args, **kwargs)

    monkeypatch.setattr(Controller, "plan", plan)
    monkeypatch.setattr(controller_module, "build_plan", build)
    return counts


def status(shell: InteractiveShell, counts: dict[str, int]) -> str:
    """`%tfgpu` (the status) after `limit 2GB` and `growth on`, with the counts of that one call."""
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("tfgpu", "limit 2GB")
        shell.run_line_magic("tfgpu", "growth on")
    counts.update(plan=0, build_plan=0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shell.run_line_magic("tfgpu", "")
    return out.getvalue()


INSTALLED = {"TensorFlow alone": {}, "JAX": {"jax_installed": True}, "PyTorch": {"torch_installed": True},
             "JAX and PyTorch": {"jax_installed": True, "torch_installed": True}}
"""Which of JAX and PyTorch count as installed (and not imported: neither is imported by these tests)."""
ROWS = {"jax_installed": "JAX:", "torch_installed": "PyTorch:"}


@pytest.mark.parametrize("installed", INSTALLED)
@pytest.mark.parametrize("start", STARTS)
def test_a_status_builds_one_plan(shell, magic, plans, installed_frameworks, start, installed) -> None:
    """One `build_plan` per status in every start state, JAX and PyTorch installed or not; the rows of
    those installed say what their import will bring."""
    installed_frameworks(**INSTALLED[installed])
    fake, controller = session(start)
    magic(controller)
    text = status(shell, plans)
    assert "Policy:" in text and "limit 2GB" in text
    assert plans == {"plan": 1, "build_plan": 1}
    for flag, row in ROWS.items():
        shown = [line for line in text.splitlines() if line.startswith(row)]
        if INSTALLED[installed].get(flag):
            assert len(shown) == 1 and "not imported; at its import: " in shown[0], text
        else:
            assert shown == [], text


@pytest.mark.parametrize("start", STARTS[:2])
def test_what_an_import_brings_is_what_a_fresh_process_gets(installed_frameworks, start) -> None:
    """Before CUDA starts, the variables and fractions the one plan works out for JAX's and PyTorch's
    import are those of a fresh process's plan (built apart, as `%tfgpu export` does), which the status
    used to build as a second plan."""
    installed_frameworks(jax_installed=True, torch_installed=True)
    fake, controller = session(start)
    controller.policy = Policy(limits=((ALL_GPUS, 2048),), growth=True, allocator="async")
    plan, fresh = controller.plan(imports=True), controller.fresh_plan()
    told = set(told_to("jax") + told_to("torch"))  # what the rows show of the plan's variables
    shown = {name: value for name, value in (*plan.env, *plan.at_import.env) if name in told}
    assert plan.at_import.env and shown == {name: value for name, value in fresh.env if name in told}, shown
    assert plan.at_import.torch_fractions == fresh.torch_fractions == tuple((index, 0.125) for index in range(4))
    assert controller.plan().at_import == AtImport()  # views ask for it: applying plans none of it


def test_a_restore_too_late_is_told_without_a_second_plan(shell, magic, plans) -> None:
    """`visible` set CUDA's variables, then CUDA started: while the policy still wants them nothing waits
    for a restart (a fresh process gets them again); after `reset` their restore waits for one. Each
    status builds one plan."""
    fake, controller = session("imported")
    magic(controller)
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("tfgpu", "visible 0,1")
    fake.list_devices()
    for line, waiting in (("growth on", False), ("reset", True)):
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_line_magic("tfgpu", line)
        plans.update(plan=0, build_plan=0)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            shell.run_line_magic("tfgpu", "")
        assert plans == {"plan": 1, "build_plan": 1}, line
        restore = "CUDA_VISIBLE_DEVICES: 0,1 → unset (read when CUDA started)"
        assert (restore in out.getvalue()) is waiting, out.getvalue()

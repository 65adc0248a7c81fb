"""One plan per call: a `%tfgpu` status on a real IPython shell builds this process's plan once and hands
it down (the pending changes, the notes and the frameworks' rows read that one); the fresh process's plan
(what an import will bring) is built only where JAX or PyTorch is installed and not imported yet."""

from __future__ import annotations

import contextlib
import io
from typing import Any, Callable, Iterator

import pytest
from fake_tf import FakeTF
from IPython.core.interactiveshell import InteractiveShell

import tfgpu_magic.controller as controller_module
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import Gpu, Inventory, InventoryCatalog
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


@pytest.mark.parametrize("start", STARTS)
def test_a_status_builds_this_processs_plan_once(shell, magic, plans, tensorflow_alone, start) -> None:
    fake, controller = session(start)
    magic(controller)
    text = status(shell, plans)
    assert "Policy:" in text and "limit 2GB" in text
    assert plans["plan"] == 1, plans
    # this process's plan, and where a variable restore is too late the fresh one it is checked against
    assert plans["build_plan"] <= 2, plans


def test_the_fresh_plan_is_built_only_for_a_framework_an_import_will_tell(shell, magic, plans,
                                                                          installed_frameworks) -> None:
    """TensorFlow alone: the status builds one plan. JAX installed (not imported): one more, for the
    variables its import will bring, which the status then shows."""
    installed_frameworks()
    magic(session("before import")[1])
    status(shell, plans)
    assert plans == {"plan": 1, "build_plan": 1}
    installed_frameworks(jax_installed=True)
    magic(session("before import")[1])
    text = status(shell, plans)
    assert plans == {"plan": 1, "build_plan": 2}
    assert "JAX:" in text and "at its import: " in text

"""The trip of one value, measured: `%tfgpu limit 2GB` from the magic to each framework's call.

A profiler (`sys.setprofile`) watches every call into the package while a real IPython shell runs the
line, and keeps the calls that are handed the value in one of its forms, as an argument: the text
(`"limit 2GB"`, or its words), the policy's own value (`("all", 2048)` in an `Edit` or a `Policy`),
and each framework's own form as the plan derives it (TensorFlow's `(2048,)`, JAX's memory fraction,
PyTorch's fractions). It stops at the framework's call: the `tf.config` seam's `set_logical` (FakeTF
here: the real one is the one call of `tf/apply.py`'s seam), the environment write that JAX reads, the
`torch.cuda` seam's `set_fraction`. What it counts: the package's modules on that trip, and the forms.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Callable, Iterator

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.interactiveshell import InteractiveShell

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.language.grammar import Edit
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.plan import Plan
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.magics import TFGPUMagics

PACKAGE = "tfgpu_magic"
LINE = "limit 2GB"
POLICY_VALUE = ("all", 2048)
TF_FORM = (2048,)
JAX_FORM = 0.025
"""2 GiB of the fake's 80 GiB cards (its 40 GiB card's share is larger: JAX takes the smallest)."""
TORCH_FORM = 0.025
"""PyTorch's fraction of each 80 GiB card the kernel sees (one per card: `set_per_process_memory_fraction`)."""


def form_of(value: Any) -> str | None:
    """Which form of the value `value` is, None for none of them."""
    if isinstance(value, str):
        return "text" if "2GB" in value else "framework form" if value == f"{JAX_FORM:g}" else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
        return "text" if "2GB" in value else None
    if isinstance(value, Edit):
        return "policy value" if POLICY_VALUE in dict(value.changes).get("limits", ()) else None
    if isinstance(value, Policy):
        return "policy value" if POLICY_VALUE in value.limits else None
    if isinstance(value, Plan):
        framework_forms = value.tf_default_limits == TF_FORM, value.jax_fraction == JAX_FORM, \
            TORCH_FORM in dict(value.torch_fractions).values()
        return "framework form" if any(framework_forms) else None
    if isinstance(value, float) and value == TORCH_FORM:
        return "framework form"
    if isinstance(value, (list, tuple)) and tuple(value) == TF_FORM:
        return "framework form"
    return None


class Trip:
    """Modules and forms seen until `stop(frame)` says the framework's call has been reached."""

    def __init__(self, stop: Callable[[FrameType], bool]) -> None:
        self.stop = stop
        self.modules: list[str] = []
        self.forms: set[str] = set()
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        if self.stop(frame):
            self.done = True
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE):
            return
        code = frame.f_code
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        arguments += list(frame.f_locals.get(code.co_varnames[code.co_argcount], {}).values()) \
            if code.co_flags & 0x08 and len(code.co_varnames) > code.co_argcount else []  # **kwargs
        forms = {form for form in map(form_of, arguments) if form}
        if forms:
            self.forms |= forms
            if module not in self.modules:
                self.modules.append(module)


@pytest.fixture
def shell_on_fakes(shell: InteractiveShell) -> Iterator[tuple[InteractiveShell, Controller, FakeTF]]:
    """The test shell (a real IPython shell), its `%tfgpu` driving a controller over FakeTF (imported, two
    GPUs) and four fake cards for this test; the shell's own magic back after it."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    fake = FakeTF(2)
    controller = Controller(api=fake, environ={}, catalog=InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus())))))
    shell.register_magics(TFGPUMagics(shell, controller))
    yield shell, controller, fake
    quietimport.disarm()
    shell.register_magics(previous)


def walk(shell: InteractiveShell, stop: Callable[[FrameType], bool]) -> Trip:
    trip = Trip(stop)
    sys.setprofile(trip)
    try:
        shell.run_line_magic("tfgpu", LINE)
    finally:
        sys.setprofile(None)
    return trip


def test_limit_2gb_reaches_tensorflows_call_through_seven_modules_in_three_forms(shell_on_fakes) -> None:
    shell, _, fake = shell_on_fakes
    trip = walk(shell, lambda frame: frame.f_code.co_name == "set_logical" and frame.f_globals.get("__name__") == "fake_tf")
    assert trip.done, "the trip never reached tf.config's call"
    print("TensorFlow:", " → ".join(trip.modules))
    assert trip.forms == {"text", "policy value", "framework form"}
    assert len(trip.modules) <= 7, trip.modules


class Environ(dict):
    """The controller's environment, whose writes are calls the profiler sees (JAX reads this one)."""

    def __setitem__(self, name: str, value: str) -> None:
        super().__setitem__(name, value)


def test_limit_2gb_reaches_jax_through_its_variable_in_at_most_six_modules(shell_on_fakes, monkeypatch) -> None:
    """JAX's call is the write of its memory-fraction variable, which its backends read as they start."""
    from tfgpu_magic.frameworks import jax

    shell, controller, _ = shell_on_fakes
    monkeypatch.setattr(jax, "state", lambda: jax.JaxState(imported=True, started=False, version="0.10.2"))
    controller.environ = Environ()
    name = jax.fraction_variable({})
    trip = walk(shell, lambda frame: frame.f_code.co_name == "__setitem__" and frame.f_locals.get("name") == name)
    assert trip.done and controller.environ[name] == f"{JAX_FORM:g}"
    print("JAX:", " → ".join(trip.modules))
    assert trip.forms == {"text", "policy value", "framework form"}
    assert len(trip.modules) <= 6, trip.modules


def test_limit_2gb_reaches_pytorchs_call_through_at_most_seven_modules(shell, monkeypatch) -> None:
    """PyTorch's call is `set_per_process_memory_fraction` (FakeTorch's `set_fraction`, CUDA started,
    sharing the process's CUDA with FakeTF); TensorFlow's modules are on the way (it is set first)."""
    from fake_torch import FakeTorch

    previous = shell.magics_manager.registry["TFGPUMagics"]
    environ: dict[str, str] = {}
    tf = FakeTF(2)
    torch = FakeTorch(environ=environ, tf=tf, imported=True)
    torch.start_cuda()
    catalog = InventoryCatalog(read_inventory(Nvml(module=FakeNvml(four_gpus()))))
    shell.register_magics(TFGPUMagics(shell, Controller(api=tf, environ=environ, catalog=catalog, torch=torch)))
    try:
        trip = walk(shell, lambda frame: frame.f_code.co_name == "set_fraction"
                    and frame.f_globals.get("__name__") == "fake_torch")
    finally:
        quietimport.disarm()
        shell.register_magics(previous)
    assert trip.done and torch.fractions == {0: TORCH_FORM, 1: TORCH_FORM}
    print("PyTorch:", " → ".join(trip.modules))
    assert trip.forms == {"text", "policy value", "framework form"}
    assert len(trip.modules) <= 7, trip.modules

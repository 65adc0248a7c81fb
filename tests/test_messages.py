"""Messages that are true, on the real test IPython shell over four fake cards (tests/
fake_nvml.py's `four_gpus`) and a fake TensorFlow that lists no GPU, as the CPU build does
(tests/fake_tf.py, `FakeTF(0)`): each test was a message that said something untrue.

- directives combine in any order, in lines and in a `%%tfgpu` cell;
- "in force" only where TensorFlow has the device;
- `%tfgpu memory` says what NVML sees;
- one piece of advice per message;
- sizes one way (`language/sizes.py`) in the status, `%tfgpu memory` and the panel;
- the terminal's words on a locked runtime agree with its advice.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Iterator

import pytest
from fake_nvml import FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.error import UsageError
from IPython.core.profiledir import ProfileDir

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import quietimport
from tfgpu_magic.envvars import NAMES as OUR_ENV
from tfgpu_magic.views.notes import NO_GPU
from tfgpu_magic.views.magics import TFGPUMagics
from tfgpu_magic.views.status import TERMINAL_RESTART_HINT


class Machine:
    """The shell's `%tfgpu` over a controller of its own: four fake cards, a fake CPU-build TensorFlow."""

    def __init__(self, shell, capsys) -> None:
        self.shell, self.capsys = shell, capsys
        self.environ: dict[str, str] = {}
        self.tf = FakeTF(0, imported=False, environ=self.environ)
        inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
        self.controller = Controller(api=self.tf, environ=self.environ, catalog=InventoryCatalog(inventory))
        shell.register_magics(TFGPUMagics(shell, controller=self.controller))

    def line(self, line: str) -> str:
        """`%tfgpu LINE`: what it printed (a `UsageError` goes up)."""
        self.capsys.readouterr()
        self.shell.run_line_magic("tfgpu", line)
        return self.capsys.readouterr().out

    def cell(self, body: str) -> str:
        self.capsys.readouterr()
        self.shell.run_cell_magic("tfgpu", "", body)
        return self.capsys.readouterr().out

    def initialize(self) -> None:
        """`import tensorflow` and a first op, as the CPU build runs them (no GPU listed)."""
        quietimport.disarm()
        self.tf.imported = True
        self.controller.apply()
        self.tf.initialize()


@pytest.fixture
def machine(shell, capsys, tmp_path, monkeypatch) -> Iterator[Machine]:
    previous = shell.magics_manager.registry["TFGPUMagics"]
    outside = {name: os.environ.get(name) for name in OUR_ENV}
    monkeypatch.setattr(shell, "profile_dir", ProfileDir.create_profile_dir(str(tmp_path / "profile")))
    yield Machine(shell, capsys)
    quietimport.disarm()
    shell.register_magics(previous)
    assert {name: os.environ.get(name) for name in OUR_ENV} == outside, "the test touched os.environ"
    assert "tensorflow" not in sys.modules


def policy_line(status: str) -> str:
    """The status's policy row, its parts joined as on one line."""
    block = status.split("Policy:", 1)[1].split("\nVariables:", 1)[0]
    return "Policy:     " + "; ".join(part.strip() for part in block.strip().split("\n"))


# ----- directives combine in any order ---------------------------------------------------------------
@pytest.mark.parametrize("order", [("limit 50%", "visible auto"), ("visible auto", "limit 50%")])
def test_a_share_and_visible_combine_in_either_order(machine: Machine, order: tuple[str, str]) -> None:
    """Was: `limit 50%` then `visible auto` → "GPU 0 has a limit or split but is not visible", as a
    cell too, though the README promises any order. The share sizes the cards that end up visible."""
    for line in order:
        machine.line(line)
    shown = policy_line(machine.line(""))
    assert shown == "Policy:     visible 2 (GPU-b2d4f6a8…); limit 50% (40.0 GiB) on GPU 2; (visible: auto picked GPU 2 (79.0 GiB free, 10% busy))"


@pytest.mark.parametrize("body", ["limit 50%\nvisible 1,3\n", "visible 1,3\nlimit 50%\n",
                                  "limit 50%\nsplit 0 2x10GB\nvisible 0,1\n", "split 0 2x10GB\nvisible 0,1\nlimit 50%\n"])
def test_a_cell_gives_the_same_policy_whatever_its_order(machine: Machine, body: str) -> None:
    machine.cell(body)
    limits = dict(machine.controller.policy.limits)
    expected = {"1": 40960, "3": 20480} if "1,3" in body else {"1": 40960}  # GPU 3 is a 40 GB card; 0 is split
    assert limits == expected


def test_a_share_follows_visible_through_none_and_back(machine: Machine) -> None:
    """`limit 50%` is a share of every visible card: hidden cards drop out, and come back with it."""
    machine.line("limit 50%")
    machine.line("visible none")
    assert machine.controller.policy.limits == ()
    machine.line("visible all")
    assert dict(machine.controller.policy.limits) == {"0": 40960, "1": 40960, "2": 40960, "3": 20480}
    machine.line("limit off 3")  # the share no longer covers every visible card: each card keeps its own
    with pytest.raises(UsageError, match=r"^GPU 2 has a limit or split but is not visible \(visible: 0,1\)$"):
        machine.line("visible 0,1")


def test_a_share_spares_a_card_split_later_and_returns_when_the_split_goes(machine: Machine) -> None:
    machine.line("limit 25%")
    machine.line("split 0 2x1GB")
    assert "0" not in dict(machine.controller.policy.limits)
    machine.line("split off 0")
    assert dict(machine.controller.policy.limits)["0"] == 20480


# ----- "in force" only where TensorFlow has the device -----------------------------------------------
def test_a_gpu_setting_repeated_without_a_gpu_is_never_in_force(machine: Machine) -> None:
    """Was: `limit 2GB` repeated after initialization → "Already in force." although TensorFlow has no GPU."""
    machine.initialize()
    first, again = machine.line("limit 2GB"), machine.line("limit 2GB")
    said = f"{NO_GPU}: `limit 2GB on every visible GPU` has nothing to apply to here.\n"
    assert first == again == said
    machine.line("split cpu 2")  # a CPU setting TensorFlow has: locked after initialization
    assert "Already in force" not in machine.line("limit 2GB")


def test_a_repeated_cpu_setting_is_in_force(machine: Machine) -> None:
    """The other side: what TensorFlow does have, given again, is in force."""
    machine.line("split cpu 2")
    machine.initialize()
    assert machine.line("split cpu 2") == "Already in force.\n"


# ----- `%tfgpu memory` says what NVML sees -------------------------------------------------------------
def test_memory_says_what_nvml_sees(machine: Machine) -> None:
    """Was: "NVML sees none" while `%tfgpu` listed four cards."""
    machine.initialize()
    assert len(re.findall(r"^  \d  NVIDIA", machine.line(""), re.M)) == 4
    assert machine.line("memory") == (
        "No GPU in this process: TensorFlow lists none, and NVML sees 4 GPUs. `%tfgpu doctor` says why.\n")


def test_memory_before_import_names_what_hides_the_cards(machine: Machine) -> None:
    machine.line("visible none")
    assert machine.line("memory") == ("No GPU in this process: NVML sees 4 GPUs, and CUDA_VISIBLE_DEVICES "
                                      "leaves it none. `%tfgpu doctor` says why.\n")


# ----- one piece of advice per message -----------------------------------------------------------------
def test_a_limit_after_initialization_without_a_gpu_gives_one_piece_of_advice(machine: Machine) -> None:
    """Was: both "Restart IPython ..." (for TF_FORCE_GPU_ALLOW_GROWTH, which no GPU allocator will
    read in this process) and "has nothing to apply to here"."""
    machine.line("growth on")
    machine.initialize()
    said = machine.line("limit 3GB")
    assert f"{NO_GPU}: `limit 3GB on every visible GPU` has nothing to apply to here." in said.splitlines()
    assert "restart" not in said.lower() and "cannot change" not in said
    assert "Pending" not in machine.line("")  # the status does not list it as waiting for a restart either


def test_a_locked_cpu_setting_still_gets_its_restart_advice(machine: Machine) -> None:
    machine.line("split cpu 2")
    machine.initialize()
    said = machine.line("split cpu 3")
    assert "logical CPU devices: 2 logical devices → 3 logical devices" in said and TERMINAL_RESTART_HINT in said
    assert "nothing to apply" not in said


# ----- sizes one way --------------------------------------------------------------------------------------
def test_sizes_are_written_one_way(machine: Machine) -> None:
    """Was: "0 KiB", "20480 / 81920 MiB used", "limit 1024 MiB" where docs/grammar.md says "as you write it"."""
    machine.line("limit 1GB 1")
    machine.line("split 0 2x1GB")
    machine.line("limit 25% 2")
    status = machine.line("")
    assert policy_line(status) == "Policy:     limit 1GB on GPU 1, 25% (20.0 GiB) on GPU 2; split 0 2x1GB"
    assert "  0  NVIDIA A100-SXM4-80GB  20.0 / 80 GiB used, 50% busy" in status
    assert "       pid 4242: 19.0 GiB" in status and "MIG-5e6f7a8b-9c0d-5e1f-a2b3-c4d5e6f7a8b9  19.5 GiB" in status
    memory = machine.line("memory")
    assert "60.0 / 80 GiB" in memory and "1.0 GiB (limit on GPU 1, 1% of the card)" in memory
    for text in (status, memory):
        assert "KiB" not in text and not re.search(r"\d{4,} MiB", text), text


# ----- the terminal's words agree --------------------------------------------------------------------------
def test_a_terminal_is_told_one_way_to_restart(machine: Machine) -> None:
    """Was: "locked until the kernel restarts" in the status of terminal IPython, which has no kernel,
    and "Restart IPython" in its messages."""
    machine.line("split cpu 2")
    machine.initialize()
    assert "kernel" not in machine.line("").splitlines()[0]
    said = machine.line("split cpu 3")
    assert TERMINAL_RESTART_HINT in said and "kernel" not in said


def test_a_bad_line_is_one_usage_error(machine: Machine) -> None:
    with pytest.raises(UsageError) as raised:
        machine.line("visible auto:5")
    assert str(raised.value) == "visible auto:5: this machine has only 4 GPU(s)"



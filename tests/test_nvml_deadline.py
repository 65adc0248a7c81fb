"""A wedged NVIDIA driver: an NVML call that does not return (tests/fake_nvml.py's `block`).

Every read goes through `Nvml.run` with a deadline: past it the last good inventory is served,
marked stale, with "the NVIDIA driver is not answering" and the doctor's hint; a wedged call is not
stacked up by later reads; a process with a call stuck in it still exits; `%tfgpu`, `%tfgpu who`,
`visible auto` and the doctor on a real IPython shell answer within the deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic import doctor
from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus import inventory
from tfgpu_magic.gpus.inventory import NOT_ANSWERING, Inventory, InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.views.magics import TFGPUMagics

DEADLINE = 0.4
SLACK = 1.0
"""What a loaded two-core machine may add to a deadline before a call counts as having waited on NVML."""
TESTS = Path(__file__).resolve().parent
WEDGED = "nvmlDeviceGetMemoryInfo"
T = TypeVar("T")


class Wedge:
    """A fake NVML session over the four cards whose `function` can be made to hang until released."""

    def __init__(self, function: str = WEDGED, at_start: bool = False) -> None:
        self.function = function
        self.release = threading.Event()
        self.fake = FakeNvml(four_gpus(), block={function: self.release} if at_start else {})
        self.nvml = Nvml(module=self.fake, deadline=DEADLINE)

    def jam(self) -> None:
        self.fake.block[self.function] = self.release

    def hung_calls(self) -> int:
        return self.fake.calls.count(self.function)


@pytest.fixture
def wedge() -> Iterator[Wedge]:
    """A session wedged on demand; released at the end, so that no thread of the test outlives it."""
    made = Wedge()
    yield made
    made.release.set()


def timed(read: Callable[[], T]) -> tuple[T, float]:
    """What `read()` returned, and the seconds it took."""
    started = time.monotonic()
    found = read()
    return found, time.monotonic() - started


def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_wedged_call_serves_the_last_good_reading_marked_stale(wedge: Wedge) -> None:
    good = read_inventory(wedge.nvml)
    assert good.available and not good.stale and good.warning is None and good.blocked_seconds is None
    wedge.jam()
    stale, took = timed(lambda: read_inventory(wedge.nvml))
    assert DEADLINE <= took < DEADLINE + SLACK
    assert stale.available and stale.stale and stale.gpus == good.gpus
    assert stale.blocked_seconds >= DEADLINE and stale.stale_seconds >= DEADLINE
    assert stale.warning.startswith(f"{NOT_ANSWERING}: an NVML call has waited ")
    assert "these GPU figures are from" in stale.warning and "`%tfgpu doctor`" in stale.warning


def test_once_the_call_returns_reads_are_fresh_again(wedge: Wedge) -> None:
    read_inventory(wedge.nvml)
    wedge.jam()
    assert read_inventory(wedge.nvml).stale
    del wedge.fake.block[wedge.function]
    wedge.fake.gpus[1].used_mib = 4096
    wedge.release.set()  # the stuck read finishes (with the new figure) and becomes the last good one
    wait_for(lambda: wedge.nvml.last_good.gpus[1].memory_used_mib == 4096)
    fresh = read_inventory(wedge.nvml)
    assert not fresh.stale and fresh.warning is None and fresh.gpus[1].memory_used_mib == 4096


def test_without_an_earlier_reading_the_error_says_the_driver_is_not_answering() -> None:
    """`nvmlInit` itself hangs: making the session and reading both return within the deadline."""
    wedge = Wedge("nvmlInit", at_start=True)
    try:
        nvml, took = timed(lambda: Nvml(module=wedge.fake, deadline=DEADLINE))
        assert took < DEADLINE + SLACK and nvml.error is None and not nvml.started
        found, took = timed(lambda: read_inventory(nvml))
        assert took < SLACK  # the start is already past its deadline: nothing waits again
        assert not found.available and found.gpus == () and found.blocked_seconds >= DEADLINE
        assert found.error.startswith(f"{NOT_ANSWERING}: an NVML call has waited ")
        assert found.error.endswith("(`%tfgpu doctor` says what to do)")
        wedge.release.set()
        wait_for(lambda: nvml.started)
        assert read_inventory(nvml).gpus and read_inventory(nvml).warning is None
    finally:
        wedge.release.set()


def test_reads_while_wedged_are_not_stacked(wedge: Wedge) -> None:
    """Ten reads after the wedge take one deadline in all, and NVML is asked once."""
    read_inventory(wedge.nvml)
    wedge.jam()
    before = wedge.hung_calls()
    answers, took = timed(lambda: [read_inventory(wedge.nvml) for _ in range(10)])
    assert took < DEADLINE + SLACK, f"{took:.2f} s for ten reads"
    assert all(answer.stale for answer in answers)
    assert wedge.hung_calls() == before + 1


def test_concurrent_reads_share_one_call(wedge: Wedge) -> None:
    """Ten threads reading at once while the driver hangs: each answers within the deadline, one call."""
    read_inventory(wedge.nvml)
    wedge.jam()
    before = wedge.hung_calls()
    results: list[tuple[Inventory, float]] = []
    threads = [threading.Thread(target=lambda: results.append(timed(lambda: read_inventory(wedge.nvml))))
               for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE + 5)
    assert len(results) == 10 and all(found.stale and took < DEADLINE + SLACK for found, took in results)
    assert wedge.hung_calls() == before + 1


def test_the_doctors_compute_capabilities_are_bounded_too() -> None:
    wedge = Wedge("nvmlDeviceGetCudaComputeCapability")
    try:
        good = read_inventory(wedge.nvml)
        wedge.jam()
        found, took = timed(lambda: doctor.read_compute_capabilities(good, wedge.nvml))
        assert found == {} and took < DEADLINE + SLACK
    finally:
        wedge.release.set()


CHILD = textwrap.dedent("""
    import json, sys, time
    from fake_nvml import FakeNvml, four_gpus
    from tfgpu_magic.gpus import inventory

    nvml = inventory.Nvml(module=FakeNvml(four_gpus(), block={WHICH: 120}), deadline=DEADLINE)
    inventory.shared_nvml = lambda: nvml
    started = time.monotonic()
    found = inventory.cached_inventory()
    print(json.dumps({"took": time.monotonic() - started, "error": found.error, "left_at": time.time()}), flush=True)
""")


@pytest.mark.parametrize("which", ["nvmlInit", WEDGED])
def test_a_process_with_a_wedged_call_exits_at_once(which: str) -> None:
    """A child whose NVML call blocks for 120 s reads the inventory and ends: it must not wait for the
    call (a non-daemon thread, or an executor's, would hold it at exit for the full 120 s)."""
    code = CHILD.replace("WHICH", repr(which)).replace("DEADLINE", str(DEADLINE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    ended = time.time()
    said = json.loads(out)
    assert child.returncode == 0, err
    assert NOT_ANSWERING in said["error"] and said["took"] < DEADLINE + SLACK
    assert ended - said["left_at"] < 2.0, f"the process took {ended - said['left_at']:.1f} s to exit"


# ----- the kernel's own reads, on a real IPython shell --------------------------------------------
@pytest.fixture
def tfgpu(shell: InteractiveShell, wedge: Wedge, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[str], tuple[str, float]]]:
    """`%tfgpu LINE` on a controller whose inventory is the process's (`cached_inventory` over
    `shared_nvml`), here the wedge's session: returns what it printed and how long it took."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    monkeypatch.setattr(inventory, "shared_nvml", lambda: wedge.nvml)
    monkeypatch.setattr(inventory, "_cache", None)
    shell.register_magics(TFGPUMagics(shell, controller=Controller(environ={}, catalog=InventoryCatalog())))

    def run(line: str) -> tuple[str, float]:
        capsys.readouterr()
        monkeypatch.setattr(inventory, "_cache", None)  # every command reads NVML again
        started = time.monotonic()
        shell.run_line_magic("tfgpu", line)
        return capsys.readouterr().out, time.monotonic() - started

    yield run
    shell.register_magics(previous)


def test_who_and_status_answer_within_the_deadline_with_stale_figures(tfgpu, wedge: Wedge) -> None:
    before, _ = tfgpu("who")
    assert "GPU 0 " in before and NOT_ANSWERING not in before
    wedge.jam()
    text, took = tfgpu("who")
    assert took < DEADLINE + SLACK and text.startswith(f"Note: {NOT_ANSWERING}")
    assert "GPU 0 " in text and "`%tfgpu doctor`" in text
    status, took = tfgpu("")
    assert took < DEADLINE + SLACK and "A100" in status


def test_visible_auto_refuses_stale_figures_and_the_doctor_names_the_fix(tfgpu, wedge: Wedge) -> None:
    tfgpu("who")
    wedge.jam()
    started = time.monotonic()
    with pytest.raises(UsageError, match=f"`visible auto` needs current GPU figures: {NOT_ANSWERING}"):
        tfgpu("visible auto")
    assert time.monotonic() - started < DEADLINE + SLACK
    said, took = tfgpu("doctor")
    assert took < 2 * DEADLINE + SLACK  # the inventory's read, then the compute capabilities' (both at once here)
    line = next(line for line in said.splitlines() if "NVIDIA driver / NVML" in line)
    assert line.startswith("[FAIL]") and NOT_ANSWERING in line
    assert "nvidia-smi -r" in said and "dmesg" in said


def test_with_no_reading_at_all_status_says_why(tfgpu, wedge: Wedge) -> None:
    wedge.jam()
    status, took = tfgpu("")
    assert took < DEADLINE + SLACK and f"none found: {NOT_ANSWERING}" in status

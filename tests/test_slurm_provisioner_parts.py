"""The Slurm provisioner's parts that need no cluster: waiting for a job to start (`_await_start`:
transient `scontrol` failures waited out, persistent ones failing the start, `scontrol` asked at
growing intervals while the address is still seen at once), the job's output quoted as a hostile
file off the event loop, the policy step it shares with `tfgpu-provisioner`, and where its
environment variable names live.

`slurm_queue.job_state` is replaced by a script of answers (a Slurm whose slurmctld is busy, then
answers); the address file, the output file and the event loop are real. The same code against a
real slurmctld: tests/test_slurm_provisioner.py."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tfgpu_magic import envvars
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.jupyter import provisioner, slurm_provisioner, slurm_queue
from tfgpu_magic.jupyter.notebook_request import NotebookRequest
from tfgpu_magic.jupyter.slurm_job import ADDRESS_FILE, PORT_NAMES
from tfgpu_magic.jupyter.slurm_provisioner import SlurmProvisioner, output_tail
from tfgpu_magic.jupyter.slurm_queue import JobState, SlurmError
from tfgpu_magic.language.policy import Policy
from tfgpu_magic.safefile import write_atomic

JOB = "42"
BUSY = SlurmError(f"scontrol show job {JOB}: slurm_load_jobs error: Socket timed out on send/recv operation")
RUNNING = JobState("RUNNING", "None", "node1")
PENDING = JobState("PENDING", "Priority")


class ScriptedSlurm:
    """`slurm_queue.job_state` answering from `answers` (a `JobState` or a `SlurmError` each call, the
    last one repeated), noting when each call came."""

    def __init__(self, *answers: JobState | SlurmError) -> None:
        self.answers = list(answers)
        self.calls: list[float] = []

    async def job_state(self, job_id: str) -> JobState:
        assert job_id == JOB
        self.calls.append(time.monotonic())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, SlurmError):
            raise answer
        return answer


def write_address(folder: Path) -> None:
    record = {"job_id": JOB, "ip": "127.0.0.1", "hostname": "node1", "pid": 1,
              **{name: 40000 + index for index, name in enumerate(PORT_NAMES)}}
    write_atomic(folder / ADDRESS_FILE, json.dumps(record))


def await_start(monkeypatch: pytest.MonkeyPatch, folder: Path, slurm: ScriptedSlurm, timeout: float = 30.0,
                address_after: float | None = None) -> tuple[dict[str, Any], float]:
    """`_await_start` on `folder` against `slurm`, the address written `address_after` seconds in
    (never: None); its result and the seconds from the address's write to the return."""
    monkeypatch.setattr(slurm_queue, "job_state", slurm.job_state)
    folder.mkdir(exist_ok=True)
    written: list[float] = []

    async def scenario() -> dict[str, Any]:
        if address_after is not None:
            def write() -> None:
                write_address(folder)
                written.append(time.monotonic())
            asyncio.get_running_loop().call_later(address_after, write)
        return await SlurmProvisioner(kernel_id="k1")._await_start(folder, JOB, timeout)

    result = asyncio.run(scenario())
    return result, time.monotonic() - written[0] if written else 0.0


# ----- waiting for the job -----------------------------------------------------------------------
def test_a_few_failed_scontrol_calls_do_not_fail_the_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slurm = ScriptedSlurm(BUSY, BUSY, BUSY, PENDING, RUNNING)
    address, _ = await_start(monkeypatch, tmp_path / "job", slurm, address_after=3.0)
    assert address["ip"] == "127.0.0.1" and address["shell_port"] == 40000
    assert len(slurm.calls) >= 4  # the three failures were asked again, not the end of the start


def test_scontrol_failing_on_and_on_fails_the_start_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(slurm_provisioner, "ERROR_GRACE", 1.0)
    slurm = ScriptedSlurm(BUSY)
    began = time.monotonic()
    with pytest.raises(SlurmError) as caught:
        await_start(monkeypatch, tmp_path / "job", slurm)
    assert time.monotonic() - began >= 1.0
    assert len(slurm.calls) > slurm_provisioner.ERRORS_TOLERATED
    assert str(caught.value).startswith(str(BUSY)) and "times in a row over" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_answer_between_failures_starts_the_count_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(slurm_provisioner, "ERROR_GRACE", 0.0)
    tolerated = [BUSY] * slurm_provisioner.ERRORS_TOLERATED
    slurm = ScriptedSlurm(*tolerated, PENDING, *tolerated, RUNNING)
    address, _ = await_start(monkeypatch, tmp_path / "job", slurm, address_after=3.0)
    assert address["hostname"] == "node1"


def test_scontrol_is_asked_less_and_less_often_while_the_address_is_seen_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A job that runs but whose kernel takes 5 s to write its address (a slow node): `scontrol` at
    growing intervals (0.2 s polling would ask 25 times), the address still seen within moments."""
    slurm = ScriptedSlurm(RUNNING)
    _, seen_after = await_start(monkeypatch, tmp_path / "job", slurm, address_after=5.0)
    gaps = [later - earlier for earlier, later in zip(slurm.calls, slurm.calls[1:])]
    assert len(slurm.calls) <= 9, gaps
    assert all(later >= earlier * 0.9 for earlier, later in zip(gaps, gaps[1:])), gaps  # growing
    assert max(gaps) <= slurm_provisioner.CHECK_LAST + 0.5, gaps
    assert seen_after < 0.5, f"the address was seen {seen_after:.2f} s after it was written"


def test_a_pending_job_is_asked_at_growing_intervals_up_to_the_last(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    slurm = ScriptedSlurm(PENDING)
    with pytest.raises(SlurmError, match=r"did not start its kernel within 8 s \(PENDING, reason Priority\)"):
        await_start(monkeypatch, tmp_path / "job", slurm, timeout=8.0)
    gaps = [later - earlier for earlier, later in zip(slurm.calls, slurm.calls[1:])]
    assert gaps[0] < 0.5 and slurm_provisioner.CHECK_LAST - 0.2 <= gaps[-1] <= slurm_provisioner.CHECK_LAST + 0.5, gaps
    assert all(later >= earlier * 0.9 for earlier, later in zip(gaps, gaps[1:])), gaps
    assert len(slurm.calls) <= 9, gaps  # polling at 0.2 s would ask 40 times, at 1 s 8 times



def test_a_pending_job_without_a_reason_yet_is_asked_again_soon(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """Just submitted, a job is PENDING with reason None until the scheduler's first pass (a second or two):
    that is no news to wait longer on, so the reason that follows is in the timeout's message. Growing
    intervals would ask at 0, 0.2, 0.5 and 0.95 s (four answers without a reason), then after the timeout."""
    unsettled = JobState("PENDING", "None")
    slurm = ScriptedSlurm(unsettled, unsettled, unsettled, unsettled, JobState("PENDING", "Resources"))
    with pytest.raises(SlurmError, match=r"within 2 s \(PENDING, reason Resources\)"):
        await_start(monkeypatch, tmp_path / "job", slurm, timeout=1.5)

# ----- the job's output, for the message of a job that ended first -----------------------------------
def test_the_output_of_a_job_that_ended_first_is_read_off_the_event_loop(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    readers: list[threading.Thread] = []

    def recording_tail(folder: Path, job_id: str) -> str:
        readers.append(threading.current_thread())
        return output_tail(folder, job_id)

    monkeypatch.setattr(slurm_provisioner, "output_tail", recording_tail)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / f"job-{JOB}.out").write_text("python: No module named tfgpu_magic\n", encoding="utf-8")
    with pytest.raises(SlurmError, match=r"ended before its kernel started \(FAILED, reason NonZeroExitCode, "
                                         r"exit 1\): python: No module named tfgpu_magic$"):
        await_start(monkeypatch, folder, ScriptedSlurm(JobState("FAILED", "NonZeroExitCode", "", 1)))
    assert readers and readers[0] is not threading.main_thread()  # the event loop runs in the main thread


def bounded(call: Callable[[], str], seconds: float = 5.0) -> str:
    """`call()`'s result, or a failure if it has not returned within `seconds` (a read that blocks)."""
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still reading after {seconds} s"
    return result[0]


def test_the_output_tail_is_its_last_lines(tmp_path: Path) -> None:
    (tmp_path / f"job-{JOB}.out").write_text("".join(f"line {n}\n" for n in range(20)) + "\n  \n", encoding="utf-8")
    assert output_tail(tmp_path, JOB, lines=3) == "line 17 | line 18 | line 19"  # blank lines left out
    assert output_tail(tmp_path, "7") == ""  # no file yet


def test_an_output_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / f"job-{JOB}.out"
    os.mkfifo(fifo)
    try:
        said = bounded(lambda: output_tail(tmp_path, JOB))
    finally:  # release a reader blocked in open(), if any
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert said == f"{fifo} is not a regular file; ignoring it"


def test_an_output_file_that_is_a_device_or_too_large_is_named_not_read(tmp_path: Path) -> None:
    (tmp_path / f"job-{JOB}.out").symlink_to("/dev/zero")
    assert bounded(lambda: output_tail(tmp_path, JOB)).endswith("is not a regular file; ignoring it")
    big = tmp_path / "big"
    big.mkdir()
    (big / f"job-{JOB}.out").write_bytes(b"x\n" * slurm_provisioner.OUTPUT_BYTES)
    assert f"more than the {slurm_provisioner.OUTPUT_BYTES} allowed" in output_tail(big, JOB)


# ----- the policy: `TFGPUProvisioner.resolve`, with Slurm placing the GPUs ------------------------------
def slurm_provisioner_for(visible: str | None, slurm: tuple[str, ...] = ("--partition=gpu",)) -> SlurmProvisioner:
    return SlurmProvisioner(kernel_id="k1", policy=Policy(growth=True).to_dict(), visible=visible, slurm=list(slurm))


def test_the_policy_leaves_the_gpus_to_slurm_and_counts_them_for_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_inventory() -> None:
        raise AssertionError("the Slurm provisioner must not read this host's GPUs")

    monkeypatch.setattr(provisioner, "read_inventory", no_inventory)
    spec = slurm_provisioner_for("auto:2")
    policy, warning = spec.resolve("0,1", None, None, {})
    assert policy.visible is None and policy.growth is True and warning is None and spec._job_gpus == 2
    assert spec.resolve() == (policy, None)  # resolved once per kernel

    notebook = NotebookRequest(lines=("visible auto:1",), gpu_count=1, pick=1, source="one.ipynb", saved=True)
    spec = slurm_provisioner_for("auto:2")
    assert spec.resolve(request=notebook)[0].visible is None and spec._job_gpus == 1

    refused = NotebookRequest(refusal="one.ipynb: metadata.tfgpu.policy line 1: no such directive", source="one.ipynb")
    spec = slurm_provisioner_for("auto:2")
    assert spec.resolve(request=refused)[1] == refused.refusal and spec._job_gpus == 2

    spec = slurm_provisioner_for(None)
    assert spec.resolve()[0].visible is None and spec._job_gpus is None  # ARGS' own --gres decides


def test_options_edited_by_hand_that_do_not_pass_fail_the_policy() -> None:
    with pytest.raises(PolicyError, match="--wrap is not passed through"):
        slurm_provisioner_for(None, ("--wrap=id",)).resolve()


# ----- environment variable names: one place (tfgpu_magic/envvars.py) ----------------------------------
ENV_NAME_SHAPE = ("SLURM_", "SBATCH_", "TFGPU_MAGIC_", "JPY_", "KERNEL_", "CUDA_")


def env_names_spelled_in(path: Path) -> set[str]:
    """String literals of `path` (docstrings left out) shaped as environment variable names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and node.value.startswith(ENV_NAME_SHAPE) and node.value.rstrip("_") == node.value
            and node.value.replace("_", "").isalnum() and node.value.isupper()}


def test_the_slurm_modules_take_every_environment_variable_name_from_envvars() -> None:
    modules = sorted(Path(slurm_provisioner.__file__).parent.glob("slurm_*.py"))
    assert len(modules) >= 4
    spelled = {path.name: names for path in modules if (names := env_names_spelled_in(path))}
    assert spelled == {}, f"environment variable names spelled outside tfgpu_magic/envvars.py: {spelled}"
    for name in ("SLURM_SUBMIT_HOST", "SLURM_CONF", "TFGPU_MAGIC_SLURM_SUBMITTED", "KERNEL_LAUNCH_TIMEOUT",
                 "JPY_PARENT_PID"):
        assert getattr(envvars, name) == name
    assert env_names_spelled_in(Path(envvars.__file__)) >= {"SLURM_SUBMIT_HOST", "JPY_PARENT_PID"}  # the check sees them

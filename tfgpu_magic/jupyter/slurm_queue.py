"""The few Slurm commands a kernel's job needs, run without blocking the server's event loop.

`sbatch` submits, `scontrol -o show job` reads a job's state, reason, node and exit code (also for a
job that has just ended, while slurmctld still keeps it: `MinJobAge`), `scancel` signals or cancels.
Every command runs in the server's environment (`SLURM_CONF` and the like) unless given another, with
a timeout; a failure is `SlurmError` with Slurm's own words.
"""

from __future__ import annotations

import asyncio
import re
from typing import Mapping, NamedTuple

COMMAND_TIMEOUT = 30.0
ALIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD",
                "REQUEUE_FED", "SIGNALING", "STAGE_OUT")
"""States in which the job's kernel may still run or start (squeue(1), JOB STATE CODES)."""
ENDED_BY_SLURM = ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "DEADLINE", "OUT_OF_MEMORY", "BOOT_FAIL",
                  "REVOKED")
"""End states that Slurm (or someone's scancel) decided, not the kernel's own exit."""
GONE = "GONE"
"""The state of a job slurmctld no longer knows (ended longer ago than its `MinJobAge`)."""
_JOB_ID = re.compile(r"[0-9]{1,20}")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is its own, in one line."""


NO_REASON = "None"
"""The reason `scontrol` gives a job that has none: a running job, or a pending one the scheduler has not
looked at yet (that follows within a second or two)."""


class JobState(NamedTuple):
    """What `scontrol show job` says of a job."""

    state: str
    reason: str = NO_REASON
    node: str = ""
    exit_code: int = 0
    """The batch step's exit status; minus the signal number where a signal ended it."""

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


async def run(args: list[str], env: Mapping[str, str] | None = None, stdin: str | None = None,
              timeout: float = COMMAND_TIMEOUT) -> tuple[int, str, str]:
    """Run a Slurm command; its exit status, stdout and stderr. `SlurmError` where it cannot run."""
    try:
        process = await asyncio.create_subprocess_exec(
            *args, env=None if env is None else dict(env), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL)
    except OSError as err:
        raise SlurmError(f"cannot run {args[0]}: {err}") from None
    try:
        out, err = await asyncio.wait_for(process.communicate(None if stdin is None else stdin.encode()), timeout)
    except asyncio.TimeoutError:
        await end(process)
        raise SlurmError(f"{args[0]} did not answer within {timeout:.0f} s") from None
    except BaseException:  # the caller was cancelled (a timeout around it, a server stopping): no child lives on
        await end(process)
        raise
    return process.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def end(process: asyncio.subprocess.Process) -> None:
    """Kill `process` (if it still runs) and reap it. The reaping is shielded: a second cancellation
    of the caller stops only its wait, and asyncio's child watcher still reaps the child."""
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:  # it ended meanwhile
            pass
    await asyncio.shield(process.wait())


def one_line(text: str) -> str:
    return " ".join(text.split())[:500]


async def submit(options: list[str], script: str, env: Mapping[str, str]) -> str:
    """`sbatch --parsable OPTIONS` with `script` on stdin, in `env`; the job id."""
    code, out, err = await run(["sbatch", "--parsable", *options], env=env, stdin=script)
    job_id = out.strip().split(";")[0]
    if code != 0 or not _JOB_ID.fullmatch(job_id):
        raise SlurmError(f"sbatch refused the kernel's job: {one_line(err or out) or f'exit status {code}'}")
    return job_id


async def job_state(job_id: str) -> JobState:
    """The job's state (`GONE` once slurmctld has forgotten it); `SlurmError` where scontrol fails otherwise."""
    code, out, err = await run(["scontrol", "-o", "show", "job", job_id])
    if code != 0:
        if "invalid job id" in err.lower():
            return JobState(GONE)
        raise SlurmError(f"scontrol show job {job_id}: {one_line(err) or f'exit status {code}'}")
    fields = dict(word.partition("=")[::2] for word in out.split() if "=" in word)
    status, _, signal = fields.get("ExitCode", "0:0").partition(":")
    exit_code = -int(signal) if signal.isdigit() and int(signal) else (int(status) if status.isdigit() else 0)
    return JobState(fields.get("JobState", "UNKNOWN"), fields.get("Reason", NO_REASON), fields.get("NodeList", ""),
                    exit_code)


async def cancel(job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
    """`scancel JOB` (the job ends), or with `signal` (`INT`, `TERM`, `KILL`) that signal to its
    processes: all of them, or the batch step's own (the kernel) with `batch_only`. A job already
    ended is no error."""
    args = ["scancel"]
    if signal is not None:
        args += [f"--signal={signal}", "--batch" if batch_only else "--full"]
    code, out, err = await run([*args, job_id])
    if code != 0 and "already completing or completed" not in err and "invalid job id" not in err.lower():
        raise SlurmError(f"scancel {job_id}: {one_line(err or out) or f'exit status {code}'}")

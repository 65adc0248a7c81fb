"""`tfgpu-slurm-provisioner`: a kernel that runs as a Slurm job, with the tfgpu policy in force.

A kernelspec written by `%tfgpu kernelspec NAME --slurm "ARGS"` names it, with a `config` of `policy`,
`visible` (`auto:N`: the job's GPU count) and `slurm` (sbatch options, `slurm_args`). Per launch:

- Policy: as `TFGPUProvisioner` (whose `resolve` and `pre_launch` this reuses), except that Slurm, not
  NVML on the server's host, picks the GPUs (`_place_gpus`): the policy's `visible` is left to the
  job's grant, and the job asks for N GPUs where the notebook asks for N (`notebook_request`), else
  the kernelspec's `visible auto:N`, else ARGS' own `--gres`/`--gpus`. The server's host needs
  neither a GPU nor NVML.
- Submission: `sbatch` with a batch script that runs `slurm_job` and then `exec`s the kernel's argv, so
  the kernel starts inside the job and is its batch step; the job's output goes to a folder beside
  the connection file (`tfgpu-slurm-<kernel id>/`, on the filesystem the nodes share).
- Waiting: `launch_kernel` waits until the job has written its address (`slurm_job.ADDRESS_FILE`), up
  to `launch_timeout` seconds (or `KERNEL_LAUNCH_TIMEOUT` in the launch environment, as Enterprise
  Gateway names it). Meanwhile the server log says, at each change and every `LOG_EVERY` seconds, that
  the job is pending and Slurm's reason (`squeue`'s `%r`). After the timeout the job is cancelled and
  the start fails with one line (JupyterLab shows it in its "Error Starting Kernel" dialog).
  `scontrol` is asked at growing intervals, and its failures are waited out unless they persist
  (`StateChecks`).
- Address: the job's address and ports go into the connection info, so the server connects to the node.
  The ports the server took from jupyter_client's `LocalPortCache` are its own, and only those go back.
- Lifecycle: `poll` is the job's state (one `scontrol` per `POLL_INTERVAL` at most), an interrupt is
  `scancel --signal=INT --batch`, terminate and kill are `scancel`, `cleanup` cancels whatever is left
  (the server cancels every job when it stops). A job that Slurm ends unasked (scancel, time limit,
  preemption) is logged with its state and reason, and the kernel stays dead: the restarter's
  automatic restarts are refused without a new job, and the server declares the kernel dead after
  its restart limit. A kernel that exits by itself restarts as usual, in a new job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from jupyter_client.connect import LocalPortCache
from traitlets import Float, List, Unicode

from ..errors import PolicyError
from ..envvars import CUDA_VISIBLE_DEVICES, JPY_PARENT_PID, KERNEL_LAUNCH_TIMEOUT, SLURM_CONF, TFGPU_MAGIC_SLURM_SUBMITTED
from ..language.policy import Policy
from ..safefile import private_dir, read_json, read_text
from . import slurm_queue
from .notebook_request import NotebookRequest
from .provisioner import TFGPUProvisioner
from .slurm_args import parse_slurm_args, with_gpu_count
from .slurm_job import ADDRESS_FILE, PORT_NAMES
from .slurm_queue import ENDED_BY_SLURM, GONE, NO_REASON, JobState, SlurmError

NAME = "tfgpu-slurm-provisioner"
POLL_INTERVAL = 1.0
"""Seconds between two `scontrol` calls for one kernel (the restarter and shutdowns poll more often)."""
CHECK_FIRST = 0.2
CHECK_GROWTH = 1.5
CHECK_LAST = 2.0
"""Seconds between two `scontrol` calls while a kernel starts (`StateChecks`)."""
ERRORS_TOLERATED = 3
ERROR_GRACE = 10.0
"""`scontrol` failures a start waits out (`StateChecks`): more than `ERRORS_TOLERATED` in a row that
span `ERROR_GRACE` seconds or more fail it."""
LOG_EVERY = 10.0
"""Seconds between two "still pending" lines in the server log."""
STOP_TIMEOUT = 15.0
"""Seconds `cleanup` waits for a cancelled job to leave the queue."""
DROPPED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
KEPT = (SLURM_CONF,)
"""The job's environment leaves out the submitting process's own job settings (a server that itself
runs in a job), its GPU grant (Slurm sets the job's) and its parent pid (ipykernel would watch a pid of
another host); `SLURM_CONF` stays: it names the cluster."""
INFO_KEY = "slurm"
ADDRESS_BYTES = 4096
OUTPUT_BYTES = 256 * 1024
"""Largest job output quoted when a job ends before its kernel starts (what a job prints before its
kernel runs is a few lines; a larger file is named, not read)."""
FOLDER_PREFIX = "tfgpu-slurm-"


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The launch environment `env` as a job should get it (see `KEPT`)."""
    return {name: value for name, value in env.items()
            if name in KEPT or not (name.startswith(DROPPED_PREFIXES) or name in (CUDA_VISIBLE_DEVICES, JPY_PARENT_PID))}


def batch_script(connection_file: str, folder: Path, cmd: list[str]) -> str:
    """The job's script: `slurm_job` on the node, which then becomes the kernel."""
    launcher = [sys.executable, "-m", "tfgpu_magic.jupyter.slurm_job", connection_file, str(folder), "--", *cmd]
    return f"#!/bin/sh\nexec {shlex.join(launcher)}\n"


def read_address(folder: Path, job_id: str) -> dict[str, Any] | None:
    """The address the job wrote (`slurm_job.main`): ip and ports, checked; None until it is there (or
    while it is an earlier job's); `SlurmError` for a record that is not one."""
    try:
        record = read_json(folder / ADDRESS_FILE, ADDRESS_BYTES)
    except PolicyError as err:
        raise SlurmError(f"the job's address record: {err}") from None
    if record is None or (isinstance(record, dict) and record.get("job_id") != job_id):
        return None
    try:
        ip = str(ipaddress.ip_address(record["ip"]))
        ports = {name: record[name] for name in PORT_NAMES}
        if not all(type(port) is int and 0 < port < 65536 for port in ports.values()):
            raise ValueError("ports")
    except (KeyError, TypeError, ValueError) as err:
        raise SlurmError(f"the job's address record {folder / ADDRESS_FILE} is malformed ({err})") from None
    return {"ip": ip, **ports, "hostname": str(record.get("hostname", ""))[:255]}


def output_tail(folder: Path, job_id: str, lines: int = 5) -> str:
    """The last lines of the job's output, for an error message: read as a hostile file (`safefile`: a
    regular file of at most `OUTPUT_BYTES`, never a FIFO or a device that would block or never end);
    otherwise the one line saying why. It blocks on the filesystem: call it off the event loop."""
    try:
        text = read_text(folder / f"job-{job_id}.out", OUTPUT_BYTES) or ""
    except PolicyError as err:
        return str(err)
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])


def launch_error(err: Exception) -> Exception:
    """`err` as the exception a failed start raises: tornado's `HTTPError`, whose message a Jupyter
    server passes to the front end (JupyterLab's "Error Starting Kernel" dialog shows it; any other
    exception shows as "Unhandled error"), as Enterprise Gateway's and gateway_provisioners' do. The
    server shows the message unformatted and tornado's log formats it: it holds no `%`."""
    from tornado.web import HTTPError

    return HTTPError(500, f"{NAME}: {err}".replace("%", " percent "))


@dataclasses.dataclass
class StateChecks:
    """A starting job's state as `scontrol` last told it, and when to ask again: `CHECK_FIRST` seconds
    after a new state, then `CHECK_GROWTH` times longer after each answer that says nothing new, up to
    `CHECK_LAST` (a new reason is news too, and so is a pending job without one yet: `NO_REASON`). A
    failed `scontrol` (slurmctld busy or restarting) is tolerated until more than `ERRORS_TOLERATED` in a
    row have spanned `ERROR_GRACE` seconds: then it is the start's `SlurmError`."""

    job_id: str
    due: float
    """When to ask next (`time.monotonic()`)."""
    state: JobState | None = None
    delay: float = CHECK_FIRST
    failures: int = 0
    failing_since: float = 0.0

    async def ask(self) -> SlurmError | None:
        """Ask `scontrol` once; the failure, if it is one still tolerated."""
        asked, failure = time.monotonic(), None
        try:
            fresh = await slurm_queue.job_state(self.job_id)
        except SlurmError as err:
            self.failures, self.failing_since = self.failures + 1, self.failing_since if self.failures else asked
            failing_for = time.monotonic() - self.failing_since
            if self.failures > ERRORS_TOLERATED and failing_for >= ERROR_GRACE:
                raise SlurmError(f"{err} ({self.failures} times in a row over {failing_for:.0f} s)") from None
            fresh, failure = None, err
        else:
            self.failures = 0
        new = fresh is not None and (self.state is None or fresh[:2] != self.state[:2] or fresh[:2] == ("PENDING", NO_REASON))
        self.delay = CHECK_FIRST if new else min(self.delay * CHECK_GROWTH, CHECK_LAST)
        self.state = fresh if fresh is not None else self.state
        self.due = time.monotonic() + self.delay
        return failure


class SlurmProvisioner(TFGPUProvisioner):  # type: ignore[misc]  (jupyter_client is untyped)
    """Runs the kernel as a Slurm job (module docstring)."""

    slurm = List(Unicode(), config=True, help="sbatch options, as `slurm_args.parse_slurm_args` stores them.")
    launch_timeout = Float(120.0, config=True, help="Seconds the job may take to start its kernel (queue included).")

    _job_id: str | None = None
    """The job of the kernel being managed (None once `wait` saw it end: `has_process` is False)."""
    _submitted: str | None = None
    """The last job submitted, until `cleanup` has made sure it is gone."""
    _exit: int | None = None
    _requested: bool = False
    _ended: str | None = None
    _job_gpus: int | None = None
    _checked: JobState | None = None
    _checked_at: float = 0.0
    _server_ip: str | None = None
    _cached_ports: tuple[int, ...] = ()
    """The ports `pre_launch` took from `LocalPortCache` (the server's, not the job's)."""

    @property
    def has_process(self) -> bool:
        return self._job_id is not None

    # ----- the policy ------------------------------------------------------------------------------
    def _place_gpus(self, policy: Policy, count: int | None, request: NotebookRequest | None, refusal: str | None,
                    inherited_visible: str | None, inherited_order: str | None,
                    environ: Mapping[str, str] | None) -> tuple[Policy, str | None]:
        """`TFGPUProvisioner.resolve`'s GPU step: Slurm, not this host, places the GPUs. The policy leaves
        `visible` to the job's grant; the job's GPU count goes to `_job_gpus` (see the module docstring).
        A kernelspec's options edited by hand that do not pass are a `PolicyError` here."""
        parse_slurm_args(" ".join(shlex.quote(arg) for arg in self.slurm))
        if refusal is None and request is not None and request.gpu_count is not None:
            count = request.gpu_count
        self._job_gpus = count
        return policy.edited(visible=None, sources=tuple(s for s in policy.sources if s[0] != "visible")), None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Perform any steps in preparation for kernel process launch: `TFGPUProvisioner`'s (the
        connection file, the policy into the environment) on the job's environment (`job_environment`).
        A restart starts from this host's own address again (the previous job's node is not local).
        The ports `LocalProvisioner` takes from jupyter_client's `LocalPortCache` are noted here: the
        connection info holds the job's ports once it runs, and only the noted ones go back (`cleanup`)."""
        kwargs["env"] = job_environment(kwargs.get("env") or os.environ)
        manager = self.parent
        if manager is not None:
            if self._server_ip is None:
                self._server_ip = manager.ip
            manager.ip = self._server_ip
        taking = not self.ports_cached
        try:
            kwargs = await super().pre_launch(**kwargs)
        except PolicyError as err:  # a kernelspec edited by hand: its policy or options do not pass
            raise launch_error(err) from None
        if taking and self.ports_cached:
            self._cached_ports = tuple(self.connection_info[name] for name in PORT_NAMES)
        return kwargs

    def _return_ports(self) -> None:
        """Return the ports this server took from the `LocalPortCache` (`pre_launch`), once; never the
        job's (its node's ports, which may be ports the cache holds for other kernels of this host)."""
        cache = LocalPortCache.instance()
        for port in self._cached_ports:
            cache.return_port(port)
        self._cached_ports = ()

    # ----- the job ---------------------------------------------------------------------------------
    def _folder(self) -> Path:
        connection_file = getattr(self.parent, "connection_file", "") or os.path.join(os.getcwd(), "kernel.json")
        return Path(connection_file).resolve().parent / f"{FOLDER_PREFIX}{self.kernel_id}"

    def _timeout(self, env: Mapping[str, str]) -> float:
        try:
            return float(env[KERNEL_LAUNCH_TIMEOUT])
        except (KeyError, ValueError):
            return float(self.launch_timeout)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        """Launch a kernel with a command: submit its job, wait until it runs and has written its
        address (logging the queue meanwhile), and return the connection info at that address."""
        if self._ended is not None:  # the restarter's automatic restart after Slurm ended the job
            self.log.warning("%s: kernel %s stays dead (%s): no new job", NAME, self.kernel_id, self._ended)
            self._exit = 1
            self._job_id = self._submitted or "0"
            # the server drops a dead kernel without `cleanup`: the job's folder and the ports go now
            shutil.rmtree(self._folder(), ignore_errors=True)
            self._return_ports()
            return self.connection_info
        env = dict(kwargs.get("env") or os.environ)
        folder = self._folder()
        private_dir(folder)
        (folder / ADDRESS_FILE).unlink(missing_ok=True)
        args = tuple(self.slurm)
        if self._job_gpus is not None:
            args = with_gpu_count(args, self._job_gpus)
        options = [f"--job-name=jupyter-kernel-{str(self.kernel_id)[:8]}", f"--output={folder}/job-%j.out",
                   f"--chdir={kwargs.get('cwd') or os.getcwd()}", *args]
        env[TFGPU_MAGIC_SLURM_SUBMITTED] = f"{time.time():.3f}"
        connection_file = str(Path(self.parent.connection_file).resolve())
        try:
            job_id = await slurm_queue.submit(options, batch_script(connection_file, folder, cmd), env)
        except SlurmError as err:
            shutil.rmtree(folder, ignore_errors=True)
            raise launch_error(err) from None
        self._job_id = self._submitted = job_id
        self._exit, self._requested, self._checked = None, False, None
        self.log.info("%s: kernel %s is Slurm job %s (%s)", NAME, self.kernel_id, job_id, " ".join(args) or "no options")
        try:
            address = await self._await_start(folder, job_id, self._timeout(env))
        except BaseException as err:
            self._job_id = self._submitted = None
            await self._cancel_and_wait(job_id)
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(err, SlurmError):
                raise launch_error(err) from None
            raise
        self.ip = address["ip"]
        moved = {name: address[name] for name in ("ip", *PORT_NAMES)}
        self.connection_info = {**self.connection_info, **moved}
        for name, value in moved.items():  # the manager's own copy too: it checks both against each other
            setattr(self.parent, name, value)
        self.log.info("%s: kernel %s runs in Slurm job %s on %s (%s)", NAME, self.kernel_id, job_id,
                      address["hostname"], address["ip"])
        return self.connection_info

    async def _await_start(self, folder: Path, job_id: str, timeout: float) -> dict[str, Any]:
        """The job's address once written; the server log hears of the queue meanwhile. `SlurmError`
        where the job ends first, does not start within `timeout` seconds, or `scontrol` keeps failing
        (`StateChecks`). The address file is read every `CHECK_FIRST` seconds whatever `scontrol` last
        said (a local read, where `scontrol` asks slurmctld), so the start is seen as soon as the job
        has written it, even while `scontrol` is asked only every `CHECK_LAST` seconds."""
        began = time.monotonic()
        said, said_at = None, began
        checks = StateChecks(job_id, began)
        while True:
            address = await asyncio.to_thread(read_address, folder, job_id)
            if address is not None:
                return address
            if time.monotonic() >= checks.due:
                failure = await checks.ask()
                if failure is not None:
                    self.log.warning("%s: kernel %s: %s; asking again", NAME, self.kernel_id, failure)
            state, waited = checks.state, time.monotonic() - began
            if state is not None and not state.alive:
                tail = await asyncio.to_thread(output_tail, folder, job_id)
                raise SlurmError(f"Slurm job {job_id} ended before its kernel started ({state.state}, reason "
                                 f"{state.reason}, exit {state.exit_code})" + (f": {tail}" if tail else ""))
            if waited > timeout:
                where = f"{state.state}, reason {state.reason}" if state is not None else "its state unknown"
                raise SlurmError(f"Slurm job {job_id} did not start its kernel within {timeout:.0f} s ({where}); "
                                 f"cancelled it. Allow more time with the kernelspec's launch_timeout or "
                                 f"{KERNEL_LAUNCH_TIMEOUT}")
            if state is not None and not state.running:
                quiet = state.reason == NO_REASON and waited < LOG_EVERY  # the scheduler's first pass is yet to come
                if not quiet and (state.reason != said or time.monotonic() - said_at >= LOG_EVERY):
                    self.log.info("%s: kernel %s waits in Slurm's queue: job %s is %s (reason %s) after %.0f s",
                                  NAME, self.kernel_id, job_id, state.state, state.reason, waited)
                    said, said_at = state.reason, time.monotonic()
            await asyncio.sleep(CHECK_FIRST)

    async def _cancel_and_wait(self, job_id: str, timeout: float = STOP_TIMEOUT) -> None:
        """Cancel `job_id` and wait (up to `timeout`) until it has left the queue."""
        deadline = time.monotonic() + timeout
        try:
            await slurm_queue.cancel(job_id)
            while (await slurm_queue.job_state(job_id)).state in (*slurm_queue.ALIVE_STATES, "COMPLETING"):
                if time.monotonic() > deadline:
                    self.log.warning("%s: Slurm job %s still in the queue %.0f s after scancel", NAME, job_id, timeout)
                    return
                await asyncio.sleep(0.2)
        except SlurmError as err:
            self.log.warning("%s: could not cancel Slurm job %s: %s", NAME, job_id, err)

    # ----- the lifecycle ---------------------------------------------------------------------------
    async def poll(self) -> int | None:
        """Poll the provisioner: None while the job may still run its kernel, else its exit status.
        A job Slurm ended unasked is logged, with its state and reason, and keeps the kernel dead."""
        if self._job_id is None:
            return 0
        if self._exit is not None:
            return self._exit
        now = time.monotonic()
        if self._checked is None or now - self._checked_at >= POLL_INTERVAL:
            try:
                self._checked, self._checked_at = await slurm_queue.job_state(self._job_id), now
            except SlurmError as err:  # slurmctld busy or restarting: the kernel is not declared dead for it
                self.log.warning("%s: kernel %s: %s", NAME, self.kernel_id, err)
                return None
        state = self._checked
        if state.alive:
            return None
        self._exit = state.exit_code if state.exit_code or state.state == "COMPLETED" else 1
        if not self._requested and (state.state in ENDED_BY_SLURM or state.state == GONE):
            self._ended = f"Slurm ended job {self._job_id}: {state.state}" + (
                f", reason {state.reason}" if state.reason not in (NO_REASON, "") else "")
            self.log.warning("%s: kernel %s is dead: %s; it is not restarted (start a new kernel for a new job)",
                             NAME, self.kernel_id, self._ended)
        return self._exit

    async def wait(self) -> int | None:
        """Wait for the job's kernel to end; its exit status."""
        if self._job_id is None:
            return 0
        while (code := await self.poll()) is None:
            await asyncio.sleep(POLL_INTERVAL / 2)
        self._job_id = None  # has_process is False now
        return code

    async def send_signal(self, signum: int) -> None:
        """Sends a signal to the kernel: SIGINT (an interrupt) and other signals to the batch step,
        which is the kernel; SIGTERM and SIGKILL end the job (`terminate`, `kill`)."""
        if self._job_id is None or self._exit is not None or signum == 0:
            return
        if signum == signal.SIGTERM:
            await self.terminate()
        elif signum == signal.SIGKILL:
            await self.kill()
        else:
            await slurm_queue.cancel(self._job_id, signal.Signals(signum).name.removeprefix("SIG"), batch_only=True)

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel: SIGKILL to every process of the job, and the job cancelled."""
        if self._job_id is None or self._exit is not None:
            return
        self._requested, self._checked = True, None
        await slurm_queue.cancel(self._job_id, "KILL")
        await slurm_queue.cancel(self._job_id)

    async def terminate(self, restart: bool = False) -> None:
        """Terminate the kernel: SIGTERM to every process of the job."""
        if self._job_id is None or self._exit is not None:
            return
        self._requested, self._checked = True, None
        await slurm_queue.cancel(self._job_id, "TERM")

    async def shutdown_requested(self, restart: bool = False) -> None:
        """The kernel's shutdown was requested: the job's end that follows was asked for."""
        self._requested = True
        await super().shutdown_requested(restart=restart)

    async def cleanup(self, restart: bool = False) -> None:
        """Clean up the resources used by the provisioner: unless the kernel restarts, its job is
        cancelled (if anything of it is left), its folder removed and the server's cached ports
        returned (`_return_ports`: `LocalProvisioner.cleanup` would return the connection info's, the
        job's)."""
        if not restart:
            self._return_ports()
            self.ports_cached = False  # the base's cleanup then returns none itself
        await super().cleanup(restart=restart)
        if restart:
            return
        if self._submitted is not None:
            self._requested = True
            await self._cancel_and_wait(self._submitted)
        self._job_id = self._submitted = None
        shutil.rmtree(self._folder(), ignore_errors=True)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Captures the base information necessary for persistence relative to this instance
        (`TFGPUProvisioner`'s), and the job: its id, GPU count and why Slurm ended it, if it did."""
        info = await super().get_provisioner_info()
        info[INFO_KEY] = {"job_id": self._job_id, "gpus": self._job_gpus, "ended": self._ended}
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Loads the base information necessary for persistence relative to this instance, and the
        job (an id that is not Slurm's digits is logged and left out)."""
        await super().load_provisioner_info(provisioner_info)
        saved = provisioner_info.get(INFO_KEY)
        if not isinstance(saved, dict):
            return
        job_id, gpus, ended = saved.get("job_id"), saved.get("gpus"), saved.get("ended")
        if job_id is not None and not (isinstance(job_id, str) and job_id.isdigit() and len(job_id) <= 20):
            self.log.warning("%s: provisioner info names no Slurm job (%r); ignoring it", NAME, job_id)
            return
        self._job_id = self._submitted = job_id
        self._job_gpus = gpus if type(gpus) is int and gpus >= 0 else None
        self._ended = ended if isinstance(ended, str) else None

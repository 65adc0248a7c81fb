"""`tfgpu-slurm-provisioner`: a kernel that runs as a Slurm job, with the tfgpu policy in force.

A kernelspec written by `%tfgpu kernelspec NAME --slurm "ARGS"` names it, with a `config` of `policy`,
`visible` (`auto:N`: the job's GPU count) and `slurm` (sbatch options, `slurm_args`). Per launch:

- Policy: as `TFGPUProvisioner` (whose `pre_launch` this reuses), except that Slurm, not NVML on the
  server's host, picks the GPUs: the policy's `visible` is left to the job's grant, and the job asks
  for N GPUs where the notebook asks for N (`notebook_request`), else the kernelspec's `visible
  auto:N`, else ARGS' own `--gres`/`--gpus`. The server's host needs neither a GPU nor NVML.
- Submission: `sbatch` with a batch script that runs `slurm_job` and then `exec`s the kernel's argv, so
  the kernel starts inside the job and is its batch step; the job's output goes to a folder beside
  the connection file (`tfgpu-slurm-<kernel id>/`, on the filesystem the nodes share).
- Waiting: `launch_kernel` waits until the job has written its address (`slurm_job.ADDRESS_FILE`), up
  to `launch_timeout` seconds (or `KERNEL_LAUNCH_TIMEOUT` in the launch environment, as Enterprise
  Gateway names it). Meanwhile the server log says, at each change and every `LOG_EVERY` seconds, that
  the job is pending and Slurm's reason (`squeue`'s `%r`). After the timeout the job is cancelled and
  the start fails with one line (JupyterLab shows it in its "Error Starting Kernel" dialog).
- Address: the job's address and ports go into the connection info, so the server connects to the node.
- Lifecycle: `poll` is the job's state (one `scontrol` per `POLL_INTERVAL` at most), an interrupt is
  `scancel --signal=INT --batch`, terminate and kill are `scancel`, `cleanup` cancels whatever is left
  (the server cancels every job when it stops). A job that Slurm ends unasked (scancel, time limit,
  preemption) is logged with its state and reason, and the kernel stays dead: the restarter's
  automatic restarts are refused without a new job, and the server declares the kernel dead after
  its restart limit. A kernel that exits by itself restarts as usual, in a new job.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from traitlets import Float, List, Unicode

from ..errors import PolicyError
from ..envvars import CUDA_VISIBLE_DEVICES
from ..language.policy import Policy
from ..safefile import private_dir, read_json
from . import slurm_queue
from .notebook_request import NotebookRequest
from .provisioner import TFGPUProvisioner, auto_count, with_request
from .slurm_args import parse_slurm_args, with_gpu_count
from .slurm_job import ADDRESS_FILE, PORT_NAMES, SUBMITTED_ENV
from .slurm_queue import ENDED_BY_SLURM, GONE, JobState, SlurmError

NAME = "tfgpu-slurm-provisioner"
LAUNCH_TIMEOUT_ENV = "KERNEL_LAUNCH_TIMEOUT"
"""Enterprise Gateway's name for the seconds a kernel may take to start."""
POLL_INTERVAL = 1.0
"""Seconds between two `scontrol` calls for one kernel (the restarter and shutdowns poll more often)."""
LOG_EVERY = 10.0
"""Seconds between two "still pending" lines in the server log."""
STOP_TIMEOUT = 15.0
"""Seconds `cleanup` waits for a cancelled job to leave the queue."""
DROPPED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
KEPT = ("SLURM_CONF",)
"""The job's environment leaves out the submitting process's own job settings (a server that itself
runs in a job), its GPU grant (Slurm sets the job's) and its parent pid (ipykernel would watch a pid of
another host); `SLURM_CONF` stays: it names the cluster."""
INFO_KEY = "slurm"
ADDRESS_BYTES = 4096
FOLDER_PREFIX = "tfgpu-slurm-"


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The launch environment `env` as a job should get it (see `KEPT`)."""
    return {name: value for name, value in env.items()
            if name in KEPT or not (name.startswith(DROPPED_PREFIXES) or name in (CUDA_VISIBLE_DEVICES, "JPY_PARENT_PID"))}


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
    """The last lines of the job's output, for an error message."""
    path = folder / f"job-{job_id}.out"
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 4096))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def launch_error(err: Exception) -> Exception:
    """`err` as the exception a failed start raises: tornado's `HTTPError`, whose message a Jupyter
    server passes to the front end (JupyterLab's "Error Starting Kernel" dialog shows it; any other
    exception shows as "Unhandled error"), as Enterprise Gateway's and gateway_provisioners' do. The
    server shows the message unformatted and tornado's log formats it: it holds no `%`."""
    from tornado.web import HTTPError

    return HTTPError(500, f"{NAME}: {err}".replace("%", " percent "))


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

    @property
    def has_process(self) -> bool:
        return self._job_id is not None

    # ----- the policy ------------------------------------------------------------------------------
    def resolve(self, inherited_visible: str | None = None, inherited_order: str | None = None,
                request: NotebookRequest | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[Policy, str | None]:
        """The policy in force for this launch without its `visible` (the job's grant decides), and a
        warning for the first cell; the job's GPU count in `_job_gpus` (see the module docstring)."""
        if self._resolved is not None:
            return self._resolved, self._warning
        parse_slurm_args(" ".join(shlex.quote(arg) for arg in self.slurm))  # a hand-edited spec: PolicyError
        policy = Policy.from_dict(self.policy) if self.policy else Policy()
        count = auto_count(self.visible) if self.visible else None
        policy, count, refusal = with_request(policy, count, request)
        if refusal is None and request is not None and request.gpu_count is not None:
            count = request.gpu_count
        self._job_gpus = count
        policy = policy.edited(visible=None, sources=tuple(s for s in policy.sources if s[0] != "visible"))
        policy.validate()
        self._resolved, self._warning = policy, refusal
        return policy, refusal

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Perform any steps in preparation for kernel process launch: `TFGPUProvisioner`'s (the
        connection file, the policy into the environment) on the job's environment (`job_environment`).
        A restart starts from this host's own address again (the previous job's node is not local)."""
        kwargs["env"] = job_environment(kwargs.get("env") or os.environ)
        manager = self.parent
        if manager is not None:
            if self._server_ip is None:
                self._server_ip = manager.ip
            manager.ip = self._server_ip
        try:
            return await super().pre_launch(**kwargs)
        except PolicyError as err:  # a kernelspec edited by hand: its policy or options do not pass
            raise launch_error(err) from None

    # ----- the job ---------------------------------------------------------------------------------
    def _folder(self) -> Path:
        connection_file = getattr(self.parent, "connection_file", "") or os.path.join(os.getcwd(), "kernel.json")
        return Path(connection_file).resolve().parent / f"{FOLDER_PREFIX}{self.kernel_id}"

    def _timeout(self, env: Mapping[str, str]) -> float:
        try:
            return float(env[LAUNCH_TIMEOUT_ENV])
        except (KeyError, ValueError):
            return float(self.launch_timeout)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        """Launch a kernel with a command: submit its job, wait until it runs and has written its
        address (logging the queue meanwhile), and return the connection info at that address."""
        if self._ended is not None:  # the restarter's automatic restart after Slurm ended the job
            self.log.warning("%s: kernel %s stays dead (%s): no new job", NAME, self.kernel_id, self._ended)
            self._exit = 1
            self._job_id = self._submitted or "0"
            # the server drops a dead kernel without `cleanup`: the job's folder goes now
            shutil.rmtree(self._folder(), ignore_errors=True)
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
        env[SUBMITTED_ENV] = f"{time.time():.3f}"
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
        where the job ends first or does not start within `timeout` seconds."""
        began = time.monotonic()
        said, said_at = None, began
        while True:
            address = await asyncio.to_thread(read_address, folder, job_id)
            if address is not None:
                return address
            state = await slurm_queue.job_state(job_id)
            waited = time.monotonic() - began
            if not state.alive:
                tail = output_tail(folder, job_id)
                raise SlurmError(f"Slurm job {job_id} ended before its kernel started ({state.state}, reason "
                                 f"{state.reason}, exit {state.exit_code})" + (f": {tail}" if tail else ""))
            if waited > timeout:
                raise SlurmError(f"Slurm job {job_id} did not start its kernel within {timeout:.0f} s "
                                 f"({state.state}, reason {state.reason}); cancelled it. Allow more time with "
                                 f"the kernelspec's launch_timeout or {LAUNCH_TIMEOUT_ENV}")
            quiet = state.reason == "None" and waited < LOG_EVERY  # the scheduler's first pass is yet to come
            if not state.running and not quiet and (state.reason != said or time.monotonic() - said_at >= LOG_EVERY):
                self.log.info("%s: kernel %s waits in Slurm's queue: job %s is %s (reason %s) after %.0f s",
                              NAME, self.kernel_id, job_id, state.state, state.reason, waited)
                said, said_at = state.reason, time.monotonic()
            await asyncio.sleep(0.2 if state.running else POLL_INTERVAL)

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
                f", reason {state.reason}" if state.reason not in ("None", "") else "")
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
        cancelled (if anything of it is left) and its folder removed."""
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

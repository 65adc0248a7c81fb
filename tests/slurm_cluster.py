"""A private one-node Slurm for tests: Debian's slurm-wlm and munge, everything in one temp folder.

`slurm_cluster` (a session-scoped pytest fixture; a test module takes it with
`pytest_plugins = ["slurm_cluster"]` or `from slurm_cluster import slurm_cluster`) starts, as root:

- its own `munged` (a fresh key and socket in the folder), so the machine's munge is never needed;
- `slurmctld` and `slurmd` in the foreground as our children, on free ports, with `slurm.conf`,
  `gres.conf`, state, spool, pid and log files in the folder (cons_tres, `proctrack/linuxproc`,
  `task/none`, `Gres=gpu:4` over four character devices `nvidia0..3`, made with `mknod c 195 N`
  because Slurm refuses regular files);

and waits until `sinfo` shows the node idle. Every command of the tests goes through `SlurmCluster.env`
(`SLURM_CONF` names the folder's config). At the end of the session every job is cancelled, every
process that carries the cluster's `SLURM_CONF` (job steps, tasks) is stopped, then the daemons by
PID, and the folder is removed.

Where this machine has no Slurm (no `slurmctld`), the fixture skips with the reason; with `CI=true`
it fails instead, as CI always installs it (.ci/run).

A task that slurmd starts is outside the test's process (and mount namespace), so it cannot see a fake
NVML installed by the test: `SlurmCluster.fake_nvml_command(argv)` wraps a Python command in
tests/fake_nvml_task.py, which installs tests/fake_nvml.py's four fake GPUs at the inventory's
chokepoint inside the task and then runs the command in the same process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from servers import free_port, pid_alive, stop_pids, wait_until

TESTS = Path(__file__).resolve().parent
TASK_WRAPPER = TESTS / "fake_nvml_task.py"
CLUSTER_NAME = "tfgputests"
PARTITION = "tests"
GPUS = 4
CPUS = 16
"""CPUs declared for the node (more than this machine has: `SlurmdParameters=config_overrides`), so
several one-CPU jobs (kernels) run side by side."""
MEMORY_MIB = 8192
START_TIMEOUT = 60.0
COMMAND_TIMEOUT = 30.0
DAEMONS = ("munged", "slurmctld", "slurmd")
NVIDIA_MAJOR = 195
"""The character-device major number of /dev/nvidiaN (Linux's NVIDIA driver)."""


def _search_path() -> str:
    """PATH and the sbin folders (the daemons live there; `SLURM_TESTS_SBIN` replaces them, for the
    test of a machine without Slurm)."""
    return os.environ.get("PATH", "") + os.pathsep + os.environ.get("SLURM_TESTS_SBIN", "/usr/sbin:/sbin")


def missing_slurm() -> str | None:
    """Why this machine cannot run the private cluster, or None where it can."""
    missing = [name for name in (*DAEMONS, "mungekey", "sinfo", "sbatch", "srun", "squeue", "scancel", "scontrol")
               if shutil.which(name, path=_search_path()) is None]
    if missing:
        return f"no Slurm here ({', '.join(missing)} not found; Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the private Slurm runs its daemons as root, and these tests run as another user"
    return None


def _binary(name: str) -> str:
    found = shutil.which(name, path=_search_path())
    assert found is not None, name
    return found


def slurm_conf(root: Path, node: str, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The cluster's slurm.conf: every path in `root`, its own ports, one node with four GPUs."""
    return f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
InactiveLimit=0
MinJobAge=60
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MIB} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running private cluster (module docstring). `env`: the environment for every Slurm command
    and for processes that submit jobs; `gres_dir`: the `nvidiaN` devices behind `Gres=gpu:4`."""

    root: Path
    node: str
    env: dict[str, str]
    gres_dir: Path
    started_in: float = 0.0
    """Seconds from the first daemon's start to the node shown idle."""
    daemons: dict[str, subprocess.Popen[bytes] | int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (`["sbatch", ...]`) against this cluster: its env (extra variables in
        `env=` come on top), text output captured, cwd the cluster's folder (so a job's default
        `slurm-N.out` lands there), a timeout; `check=True` by default."""
        extra = kw.pop("env", None) or {}
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", COMMAND_TIMEOUT)
        kw.setdefault("check", True)
        kw.setdefault("cwd", self.root)
        return subprocess.run(args, env={**self.env, **extra}, **kw)

    def job_ids(self) -> list[str]:
        """Ids of the jobs in the queue (pending, running or completing)."""
        return self.run(["squeue", "-h", "-o", "%i"]).stdout.split()

    def job_field(self, job_id: str, name: str) -> str | None:
        """One field of `scontrol show job` (e.g. `JobState`, `Reason`, `NodeList`); None once Slurm has
        forgotten the job (MinJobAge after its end) or the field is absent."""
        done = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        if done.returncode != 0:
            return None
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key == name:
                return value
        return None

    def wait_job_state(self, job_id: str, *states: str, timeout: float = START_TIMEOUT) -> str:
        """Wait until job `job_id`'s `JobState` is one of `states`; returns it."""
        return wait_until(lambda: (state := self.job_field(job_id, "JobState")) in states and state,
                          timeout, f"job {job_id} in state {'/'.join(states)}", interval=0.2)

    def fake_nvml_command(self, argv: list[str]) -> list[str]:
        """`argv` (a Python command: `python -m module ...` or `python script.py ...`) wrapped so that,
        run as a job's task, it sees tests/fake_nvml.py's four fake GPUs (minor numbers 0..3, as the
        `nvidiaN` files of `gres_dir`)."""
        return [sys.executable, str(TASK_WRAPPER), *argv]

    def processes(self) -> list[int]:
        """PIDs of processes that carry this cluster's `SLURM_CONF` (job steps and their tasks, and
        anything a test started with `env`), the daemons and their own children (slurmctld's
        slurmscriptd) excepted."""
        needle = f"SLURM_CONF={self.conf}".encode()
        daemons = {self._pid(name) for name in self.daemons}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in daemons or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if (parent not in daemons and needle in (entry / "environ").read_bytes().split(b"\0")
                        and pid_alive(int(entry.name))):
                    found.append(int(entry.name))
        return found

    def cancel_all(self, timeout: float = START_TIMEOUT) -> None:
        """Cancel every job and wait until the queue is empty."""
        if self.job_ids():
            self.run(["scancel", "--full", "--partition", PARTITION], check=False)
            wait_until(lambda: not self.job_ids(), timeout, "the queue empty after scancel", interval=0.2)

    def _pid(self, name: str) -> int:
        daemon = self.daemons[name]
        return daemon if isinstance(daemon, int) else daemon.pid

    def stop(self) -> list[int]:
        """Cancel every job, stop what is left of the jobs, then the daemons; returns the PIDs of job
        processes that outlived the cancellation (stopped here, and worth a test failure)."""
        leftovers: list[int] = []
        try:
            if "slurmd" in self.daemons and "slurmctld" in self.daemons:
                with contextlib.suppress(subprocess.SubprocessError, TimeoutError, OSError):
                    self.cancel_all(timeout=20)
            leftovers = self.processes()
            if leftovers:
                stop_pids(leftovers)
        finally:
            for name in reversed(list(self.daemons)):
                stop_pids([self._pid(name)])
                daemon = self.daemons[name]
                if isinstance(daemon, subprocess.Popen):
                    daemon.wait(timeout=5)
            self.daemons.clear()
        return leftovers


def _start(cluster: SlurmCluster, name: str, args: list[str]) -> None:
    """Start daemon `name` in the foreground as our child, its output in `<root>/<name>.out`."""
    with open(cluster.root / f"{name}.out", "wb") as out:
        cluster.daemons[name] = subprocess.Popen([_binary(name), *args], env=cluster.env, stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _check_running(cluster: SlurmCluster) -> None:
    for name, daemon in cluster.daemons.items():
        if isinstance(daemon, subprocess.Popen) and daemon.poll() is not None:
            log = (cluster.root / f"{name}.log").read_text(errors="replace") if (cluster.root / f"{name}.log").exists() else ""
            out = (cluster.root / f"{name}.out").read_text(errors="replace")
            raise RuntimeError(f"{name} exited with {daemon.returncode}: {(out + log)[-2000:]}")


def _start_munge(cluster: SlurmCluster, munge_socket: Path) -> None:
    """Our own munged: a fresh key, socket, pid, seed and log in the folder (it forks; its pid file tells)."""
    root = cluster.root
    subprocess.run([_binary("mungekey"), "--create", "--keyfile", str(root / "munge.key")], check=True,
                   capture_output=True, timeout=COMMAND_TIMEOUT)
    pid_file = root / "munged.pid"
    subprocess.run([_binary("munged"), "--force", f"--socket={munge_socket}", f"--key-file={root / 'munge.key'}",
                    f"--log-file={root / 'munged.log'}", f"--pid-file={pid_file}", f"--seed-file={root / 'munged.seed'}"],
                   check=True, capture_output=True, timeout=COMMAND_TIMEOUT, env=cluster.env)
    cluster.daemons["munged"] = int(wait_until(lambda: pid_file.read_text().strip(), 10, "munged's pid file"))
    wait_until(munge_socket.exists, 10, "munged's socket")


def _node_state(cluster: SlurmCluster) -> str:
    _check_running(cluster)
    done = cluster.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=10)
    return done.stdout.strip() if done.returncode == 0 else ""


def start_cluster(root: Path) -> SlurmCluster:
    """Write the configuration into `root` (a fresh folder of ours), start munged, slurmctld and slurmd,
    and wait until the node is idle. On failure whatever started is stopped before the error goes on."""
    node = socket.gethostname().split(".")[0]
    gres_dir = root / "dev"
    munge_socket = root / "munge.socket"
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    env["PATH"] = _search_path()
    for name in [name for name in env if name.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))]:
        if name != "SLURM_CONF":
            del env[name]  # a test run inside a job must not hand its job's settings to ours
    cluster = SlurmCluster(root=root, node=node, env=env, gres_dir=gres_dir)
    began = time.monotonic()
    try:
        for folder in (root / "state", root / "spool", gres_dir):
            folder.mkdir(mode=0o755)
        for index in range(GPUS):
            os.mknod(gres_dir / f"nvidia{index}", 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
        (root / "plugstack.conf").write_text("", encoding="ascii")
        (root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={gres_dir}/nvidia[0-{GPUS - 1}]\n",
                                        encoding="ascii")
        (root / "slurm.conf").write_text(slurm_conf(root, node, free_port(), free_port(), munge_socket),
                                         encoding="ascii")
        _start_munge(cluster, munge_socket)
        _start(cluster, "slurmctld", ["-D", "-i", "-f", str(cluster.conf)])
        _start(cluster, "slurmd", ["-D", "-f", str(cluster.conf)])
        wait_until(lambda: _node_state(cluster) == "idle", START_TIMEOUT, "the Slurm node idle", interval=0.2)
    except BaseException:
        cluster.stop()
        raise
    cluster.started_in = time.monotonic() - began
    return cluster


@contextlib.contextmanager
def private_cluster() -> Iterator[SlurmCluster]:
    """A private cluster in a fresh temp folder (short: munge's socket path is limited), removed after."""
    root = Path(tempfile.mkdtemp(prefix="tfgpu-slurm-"))
    try:
        cluster = start_cluster(root)
        try:
            yield cluster
        finally:
            leftovers = cluster.stop()
            if leftovers:
                print(f"slurm_cluster: job processes outlived scancel and were stopped: {leftovers}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's private Slurm (module docstring); skips where there is none, fails instead in CI."""
    reason = missing_slurm()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the Slurm tests: {reason}")
        pytest.skip(reason)
    with private_cluster() as cluster:
        yield cluster

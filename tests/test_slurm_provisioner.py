"""Kernels that run as Slurm jobs (`tfgpu-slurm-provisioner`), on the private cluster of
tests/slurm_cluster.py and a real `jupyter server`: the kernel starts inside the job at the address the
job reported, waits visibly in the queue, is dead when Slurm ends its job, takes the notebook's GPU
count, and no job outlives the server; with the provisioner in this process, the server's cached
ports go back and the job's do not, and a start waits out `scontrol` failing for a moment. The job's
task sees tests/fake_nvml.py's four GPUs through the wrapper (`SlurmCluster.fake_nvml_command`); Slurm's own GPU grant (gres over `nvidia0..3`) is real.
Also the pure parts: the sbatch options `--slurm` takes (`slurm_args`) and the kernelspec it writes."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any, Iterator

import pytest
from IPython.core.error import UsageError
from servers import JupyterEnv, JupyterServer, isolated_jupyter, running_server, stop_pids, wait_until
from slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (the fixture)

from tfgpu_magic.errors import PolicyError
from tfgpu_magic.jupyter import kernelspec as specs
from tfgpu_magic.jupyter.slurm_args import gpu_request, parse_slurm_args, with_gpu_count
from tfgpu_magic.jupyter.slurm_provisioner import FOLDER_PREFIX, NAME, job_environment
from tfgpu_magic.language.policy import AUTO_PICKED, Policy

SPEC = "slurm-gpu2"
START_TIMEOUT = 90.0


# ----- the options `--slurm` takes (pure) ------------------------------------------------------------
def test_options_are_stored_in_one_canonical_form() -> None:
    assert parse_slurm_args("-p gpu --time 1:00:00 -A proj --gres=gpu:a100:2 -c4 --exclusive") == (
        "--partition=gpu", "--time=1:00:00", "--account=proj", "--gres=gpu:a100:2", "--cpus-per-task=4", "--exclusive")
    assert parse_slurm_args("--comment 'two words'") == ("--comment=two words",)


@pytest.mark.parametrize(("args", "message"), [
    ("--wrap=hostname", "--wrap is not passed through"),
    ("--output=/tmp/x", "--output is not passed through"),
    ("--export=ALL,LD_PRELOAD=x", "--export is not passed through"),
    ("-N 2", "a kernel is one process on one node"),
    ("--ntasks=4", "a kernel is one process on one node"),
    ("sleep", "the word 'sleep' is not passed through"),
    ("--time", "--time needs a value"),
    ("-p a -p b", "--partition is given twice"),
    ("'unclosed", "cannot split"),
    ("--exclusive=user", "--exclusive takes no value"),
    ("--gres=gpu:two", "cannot read a GPU count"),
    ("--gpus=a100:1 --gres=gpu:h100:1", "GPUs of several types"),
    ("--comment=" + "x" * 300, "at most 256"),
])
def test_options_that_do_not_pass_are_refused_in_one_line(args: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)) as caught:
        parse_slurm_args(args)
    assert "\n" not in str(caught.value)


def test_a_notebook_count_replaces_the_options_gpus_and_keeps_the_rest() -> None:
    args = parse_slurm_args("-p gpu --gres=gpu:a100:2,license:1 --gpus-per-node=2")
    assert gpu_request(args).count == 4 and gpu_request(args).kind == "a100"
    assert with_gpu_count(args, 1) == ("--partition=gpu", "--gres=license:1,gpu:a100:1")
    assert with_gpu_count(args, 0) == ("--partition=gpu", "--gres=license:1")
    assert with_gpu_count(parse_slurm_args("--gpus=3"), 2) == ("--gres=gpu:2",)


def test_the_job_environment_leaves_out_the_submitters_job_and_grant() -> None:
    env = job_environment({"SLURM_CONF": "/etc/x.conf", "SLURM_JOB_ID": "7", "SBATCH_PARTITION": "p",
                           "CUDA_VISIBLE_DEVICES": "0", "JPY_PARENT_PID": "1", "HOME": "/h"})
    assert env == {"SLURM_CONF": "/etc/x.conf", "HOME": "/h"}


# ----- the kernelspec (`%tfgpu kernelspec NAME --slurm`) ------------------------------------------------
def test_the_kernelspec_names_the_slurm_provisioner_with_its_options() -> None:
    spec = specs.kernel_json(Policy(growth=True), slurm="-p tests --gres=gpu:2")
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == NAME
    assert provisioner["config"]["slurm"] == ["--partition=tests", "--gres=gpu:2"]
    assert provisioner["config"]["policy"]["growth"] is True
    assert "Slurm" in spec["display_name"]


def test_the_kernelspec_refuses_gpus_named_or_counted_twice() -> None:
    with pytest.raises(PolicyError, match="Slurm grants the job's GPUs"):
        specs.kernel_json(Policy(visible=("0",)), slurm="--gres=gpu:1")
    picked = Policy(visible=("1",), sources=(("visible", AUTO_PICKED + "GPU 1"),))
    assert picked.picked_automatically
    with pytest.raises(PolicyError, match="give the count once"):
        specs.kernel_json(picked, slurm="--gres=gpu:1")
    assert specs.kernel_json(picked, slurm="-p tests")["metadata"]["kernel_provisioner"]["config"]["visible"] == "auto:1"


def test_the_magic_writes_a_slurm_kernelspec_and_refuses_bad_options(shell: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    shell.run_line_magic("tfgpu", 'kernelspec on-slurm --slurm "--partition=tests --gres=gpu:1"')
    written = json.loads((tmp_path / "kernels" / "on-slurm" / "kernel.json").read_text())
    assert written["metadata"]["kernel_provisioner"]["config"]["slurm"] == ["--partition=tests", "--gres=gpu:1"]
    for line, message in (('kernelspec other --slurm "--wrap=id"', "--wrap is not passed through"),
                          ('kernelspec on-slurm --remove --slurm "-p x"', "makes no sense with --remove")):
        with pytest.raises(UsageError, match=re.escape(message)):
            shell.run_line_magic("tfgpu", line)
    assert sorted(path.name for path in (tmp_path / "kernels").iterdir()) == ["on-slurm"]


# ----- real kernels in real jobs -------------------------------------------------------------------------
def write_slurm_kernelspec(env: JupyterEnv, cluster: SlurmCluster, name: str, options: str,
                           policy: Policy = Policy(), **config: Any) -> None:
    """The kernelspec `%tfgpu kernelspec NAME --slurm OPTIONS` writes, its argv run through the fake-NVML
    wrapper; `config` edits its provisioner config afterwards, as a hand would."""
    spec = specs.kernel_json(policy, slurm=options)
    spec["argv"] = cluster.fake_nvml_command(spec["argv"])
    spec["metadata"]["kernel_provisioner"]["config"].update(config)
    (env.kernels_dir / name).mkdir(parents=True)
    (env.kernels_dir / name / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


@contextlib.contextmanager
def slurm_server(cluster: SlurmCluster) -> Iterator[JupyterServer]:
    """A Jupyter server that submits to `cluster`, with the kernelspec `SPEC` (two GPUs)."""
    with isolated_jupyter() as env:
        env.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=cluster.env["PATH"])
        write_slurm_kernelspec(env, cluster, SPEC, "--gres=gpu:2 --time=10")
        with running_server(env) as server:
            yield server


@pytest.fixture(scope="module")
def server(slurm_cluster: SlurmCluster) -> Iterator[JupyterServer]:
    with slurm_server(slurm_cluster) as running:
        yield running
    assert slurm_cluster.job_ids() == []


@pytest.fixture(autouse=True)
def empty_queue(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test of a real job starts and ends with an empty queue (a leftover job fails the test)."""
    if "slurm_cluster" not in request.fixturenames:
        yield
        return
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    cluster.cancel_all()
    yield
    left = cluster.job_ids()
    cluster.cancel_all()
    assert left == [], f"jobs left in the queue: {left}"


def kernel_job(cluster: SlurmCluster) -> str:
    """The one kernel job in the queue."""
    jobs = [job for job in cluster.job_ids() if (cluster.job_field(job, "JobName") or "").startswith("jupyter-kernel-")]
    assert len(jobs) == 1, jobs
    return jobs[0]


def kernel_gone(server: JupyterServer, kernel_id: str) -> bool:
    try:
        return server.request("GET", f"api/kernels/{kernel_id}").get("execution_state") == "dead"
    except urllib.error.HTTPError as err:
        return err.code == 404


def test_a_kernel_runs_inside_its_job_at_the_address_the_job_reported(server: JupyterServer,
                                                                      slurm_cluster: SlurmCluster) -> None:
    kernel_id = server.create_kernel(SPEC)
    job = kernel_job(slurm_cluster)
    assert slurm_cluster.job_field(job, "JobState") == "RUNNING"
    folder = server.env.runtime_dir / f"{FOLDER_PREFIX}{kernel_id}"
    reported = json.loads((folder / "address.json").read_text())
    assert reported["job_id"] == job
    assert json.loads(server.connection_file(kernel_id).read_text())["ip"] == reported["ip"]
    kernel = server.connect(kernel_id)
    inside = kernel.evaluate(
        "(lambda os, socket, subprocess: {'job': os.environ.get('SLURM_JOB_ID'), 'gpus': os.environ.get('SLURM_JOB_GPUS'),"
        " 'addresses': subprocess.run(['hostname', '-I'], capture_output=True, text=True).stdout.split(),"
        " 'pid': os.getpid(), 'ext': 'tfgpu_magic' in get_ipython().extension_manager.loaded,"
        " 'policy': os.environ.get('TFGPU_MAGIC_POLICY')})"
        "(__import__('os'), __import__('socket'), __import__('subprocess'))")
    assert inside["job"] == job and len(inside["gpus"].split(",")) == 2
    assert reported["ip"] in inside["addresses"] and reported["pid"] == inside["pid"]  # the node's own, not loopback
    assert inside["ext"] and json.loads(inside["policy"])["visible"] is None  # the policy is in force, Slurm's grant stands
    gpus = kernel.evaluate("[gpu.uuid for gpu in __import__('tfgpu_magic.gpus.inventory').gpus.inventory.read_inventory().gpus]")
    assert len(gpus) == 4  # the fake NVML inside the job's task
    kernel.close()
    server.delete_kernel(kernel_id)
    assert slurm_cluster.job_ids() == [] and not folder.exists()


def test_an_interrupt_reaches_the_kernel_in_its_job(server: JupyterServer, slurm_cluster: SlurmCluster) -> None:
    kernel_id = server.create_kernel(SPEC)
    kernel = server.connect(kernel_id)
    try:
        sent = kernel.client.execute("import time; time.sleep(60)")
        time.sleep(1.0)
        began = time.monotonic()
        server.request("POST", f"api/kernels/{kernel_id}/interrupt")
        reply = wait_until(lambda: (msg := kernel.client.get_shell_msg(timeout=30))["parent_header"].get("msg_id") == sent
                           and msg, 30, "the cell's reply")
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - began < 10
        assert kernel.evaluate("1 + 1") == 2
    finally:
        kernel.close()
        server.delete_kernel(kernel_id)


def test_a_restart_is_a_new_job_and_the_old_one_is_gone(server: JupyterServer, slurm_cluster: SlurmCluster) -> None:
    kernel_id = server.create_kernel(SPEC)
    first = kernel_job(slurm_cluster)
    server.connect(kernel_id).close()  # a kernel that answers, as one a user restarts
    server.restart_kernel(kernel_id)
    second = kernel_job(slurm_cluster)
    assert second != first and slurm_cluster.job_field(first, "JobState") in (None, "COMPLETED")  # it shut down cleanly
    kernel = server.connect(kernel_id)
    assert kernel.evaluate("__import__('os').environ['SLURM_JOB_ID']") == second
    kernel.close()
    server.delete_kernel(kernel_id)


def test_a_job_slurm_cancels_leaves_the_kernel_dead_with_the_reason(server: JupyterServer,
                                                                    slurm_cluster: SlurmCluster) -> None:
    kernel_id = server.create_kernel(SPEC)
    job = kernel_job(slurm_cluster)
    slurm_cluster.run(["scancel", job])
    began = time.monotonic()
    seen_jobs: set[str] = set()

    def dead() -> bool:
        seen_jobs.update(slurm_cluster.job_ids())
        return kernel_gone(server, kernel_id)

    wait_until(dead, 60, "the server declaring the kernel dead", interval=0.5)
    print(f"scancel to dead: {time.monotonic() - began:.1f} s")
    assert seen_jobs <= {job}  # no new job was submitted for the refused restarts
    assert f"is dead: Slurm ended job {job}: CANCELLED" in server.log.read_text()
    assert not (server.env.runtime_dir / f"{FOLDER_PREFIX}{kernel_id}").exists()


def test_a_queued_job_is_shown_waiting_then_runs(slurm_cluster: SlurmCluster) -> None:
    blocker = slurm_cluster.run(["sbatch", "--parsable", "--gres=gpu:4", "--output=/dev/null", "--wrap", "sleep 300"]).stdout.strip()
    slurm_cluster.wait_job_state(blocker, "RUNNING")
    with slurm_server(slurm_cluster) as server:
        started: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: started.update(id=server.create_kernel(SPEC)), daemon=True)
        thread.start()
        job = wait_until(lambda: [j for j in slurm_cluster.job_ids() if j != blocker], 30, "the kernel's job")[0]
        assert slurm_cluster.job_field(job, "JobState") == "PENDING"
        reason = wait_until(lambda: slurm_cluster.run(["squeue", "-h", "-j", job, "-o", "%r"]).stdout.strip() == "Resources",
                            30, "Slurm's reason")
        assert reason
        wait_until(lambda: f"job {job} is PENDING (reason Resources)" in server.log.read_text(), 30, "the log line")
        time.sleep(5)  # long enough a wait for the kernel's first cell to mention it
        slurm_cluster.run(["scancel", blocker])
        thread.join(START_TIMEOUT)
        assert "id" in started, server.log_tail()
        kernel = server.connect(started["id"])
        first = kernel.run("1")
        assert re.search(rf"waited \d+ s in Slurm's queue \(job {job} on ", first.output), first.output
        kernel.close()
        assert slurm_cluster.job_ids() == [job]
    assert slurm_cluster.job_ids() == []  # the server's stop cancelled the kernel's job


def test_a_job_that_does_not_start_in_time_is_cancelled_and_the_start_fails(slurm_cluster: SlurmCluster) -> None:
    blocker = slurm_cluster.run(["sbatch", "--parsable", "--gres=gpu:4", "--output=/dev/null", "--wrap", "sleep 300"]).stdout.strip()
    with isolated_jupyter() as env:
        env.environ.update(SLURM_CONF=slurm_cluster.env["SLURM_CONF"], PATH=slurm_cluster.env["PATH"])
        write_slurm_kernelspec(env, slurm_cluster, "impatient", "--gres=gpu:1", launch_timeout=3)
        with running_server(env) as server:
            with pytest.raises(urllib.error.HTTPError) as caught:
                server.create_kernel("impatient")
            body = caught.value.read().decode()
            assert "did not start its kernel within 3 s (PENDING, reason Resources); cancelled it" in body
            assert slurm_cluster.job_ids() == [blocker]
            assert not list(env.runtime_dir.glob(f"{FOLDER_PREFIX}*"))
    slurm_cluster.cancel_all()  # the blocker


@pytest.mark.parametrize(("options", "message"), [
    (["--wrap=id"], "--wrap is not passed through"),  # a kernel.json edited by hand
    (["--partition=nosuch"], "sbatch refused the kernel's job: sbatch: error: invalid partition specified: nosuch"),
])
def test_a_start_that_cannot_be_submitted_fails_in_one_line(server: JupyterServer, slurm_cluster: SlurmCluster,
                                                           options: list[str], message: str) -> None:
    name = f"refused-{len(list(server.env.kernels_dir.iterdir()))}"
    write_slurm_kernelspec(server.env, slurm_cluster, name, "", slurm=options)
    with pytest.raises(urllib.error.HTTPError) as caught:
        server.create_kernel(name)
    reply = json.loads(caught.value.read())
    assert message in reply["message"] and "\n" not in reply["message"]
    assert slurm_cluster.job_ids() == [] and not list(server.env.runtime_dir.glob(f"{FOLDER_PREFIX}*"))


def test_the_notebooks_gpu_count_wins_over_the_kernelspecs(server: JupyterServer, slurm_cluster: SlurmCluster) -> None:
    notebook = {"cells": [], "metadata": {"tfgpu": {"policy": ["visible auto:1", "growth on"]}}, "nbformat": 4,
                "nbformat_minor": 5}
    (server.env.root / "one-gpu.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    session = server.request("POST", "api/sessions", {"path": "one-gpu.ipynb", "name": "one-gpu.ipynb",
                                                      "type": "notebook", "kernel": {"name": SPEC}})
    kernel_id = session["kernel"]["id"]
    job = kernel_job(slurm_cluster)
    assert "gpu:1" in (slurm_cluster.job_field(job, "TresPerNode") or "")
    kernel = server.connect(kernel_id)
    inside = kernel.evaluate("__import__('os').environ['SLURM_JOB_GPUS']")
    assert len(inside.split(",")) == 1  # the kernelspec said --gres=gpu:2
    assert json.loads(kernel.evaluate("__import__('os').environ['TFGPU_MAGIC_POLICY']"))["growth"] is True
    kernel.close()
    server.request("DELETE", f"api/sessions/{session['id']}")
    wait_until(lambda: slurm_cluster.job_ids() == [], 30, "the job gone after the session's end")


def test_no_job_outlives_the_server(slurm_cluster: SlurmCluster) -> None:
    with slurm_server(slurm_cluster) as server:
        kernels = [server.create_kernel(SPEC) for _ in range(2)]
        assert len(slurm_cluster.job_ids()) == 2 and len(server.env.processes()) == 3  # the server and two kernels
        stuck = server.connect(kernels[1])  # a kernel that ignores interrupts and SIGTERM: only scancel ends it
        stuck.client.execute("import signal, time\nfor sig in (signal.SIGINT, signal.SIGTERM):\n"
                             "    signal.signal(sig, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)")
        time.sleep(1)
        stuck.close()
        began = time.monotonic()
        stop_pids([server.process.pid], timeout=60)  # SIGTERM, as a user's Ctrl-C or a service stop
        print(f"server stop with a stuck kernel: {time.monotonic() - began:.1f} s")
        assert slurm_cluster.job_ids() == []
        assert server.env.processes() == []  # no kernel left (before `server.stop` would stop any by PID)
        assert all(not server.connection_file(kernel).exists() for kernel in kernels)
        assert not list(server.env.runtime_dir.glob(f"{FOLDER_PREFIX}*"))


# ----- the provisioner in this process: a `KernelManager` as a server runs one ---------------------------
@contextlib.contextmanager
def in_process_manager(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch,
                       path: str | None = None) -> Iterator[tuple[JupyterEnv, Any]]:
    """An `AsyncKernelManager` for a Slurm kernelspec (one GPU), run in this process so the test sees
    what a server's process holds (jupyter_client's `LocalPortCache`); Slurm's commands run with this
    process's environment, its PATH `path` where given."""
    from jupyter_client.manager import AsyncKernelManager

    with isolated_jupyter() as env:
        env.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=path or cluster.env["PATH"])
        for name in ("SLURM_CONF", "PATH"):
            monkeypatch.setenv(name, env.environ[name])
        write_slurm_kernelspec(env, cluster, "in-process", "--gres=gpu:1 --time=10")
        manager = AsyncKernelManager(kernel_name="in-process", kernel_spec_manager=env.kernelspec_manager(),
                                     connection_file=str(env.runtime_dir / "kernel-in-process.json"))
        yield env, manager


def port_set(info: dict[str, Any]) -> set[int]:
    return {info[name] for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")}


def test_cleanup_returns_the_servers_cached_ports_never_the_jobs(slurm_cluster: SlurmCluster,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The server takes five ports from `LocalPortCache` for the connection file; the job, finding them
    taken on its node, binds others. At the end the server's five go back to the cache, and the job's,
    which the cache may hold for this server's local kernels, stay there."""
    import asyncio
    import socket

    from jupyter_client.connect import LocalPortCache

    cache = LocalPortCache.instance()
    blocker = slurm_cluster.run(["sbatch", "--parsable", "--gres=gpu:4", "--output=/dev/null", "--wrap", "sleep 300"]).stdout.strip()
    slurm_cluster.wait_job_state(blocker, "RUNNING")
    with in_process_manager(slurm_cluster, monkeypatch) as (env, manager), contextlib.ExitStack() as held:
        async def scenario() -> None:
            start = asyncio.ensure_future(manager.start_kernel(env=env.environ, cwd=str(env.root)))
            connection_file = Path(manager.connection_file)
            server_ports = port_set(await asyncio.to_thread(
                wait_until, lambda: connection_file.exists() and json.loads(connection_file.read_text()), 30,
                "the server's connection file"))
            assert server_ports <= cache.currently_used_ports
            for port in server_ports:  # the job's node (this host) finds the server's ports taken
                sock = held.enter_context(socket.socket())
                sock.bind(("0.0.0.0", port))
                sock.listen()
            await asyncio.to_thread(slurm_cluster.run, ["scancel", blocker])
            await asyncio.wait_for(start, START_TIMEOUT)
            job_ports = port_set(manager.get_connection_info())
            assert job_ports.isdisjoint(server_ports), (job_ports, server_ports)
            others = job_ports - cache.currently_used_ports  # as if this server's local kernels held them
            cache.currently_used_ports |= others
            try:
                await manager.shutdown_kernel(now=True)
                assert server_ports.isdisjoint(cache.currently_used_ports), "the server's ports were not returned"
                assert others <= cache.currently_used_ports, "the job's ports were taken out of the cache"
            finally:
                cache.currently_used_ports -= others

        asyncio.run(scenario())
    assert slurm_cluster.job_ids() == []


def test_a_start_waits_out_scontrol_failing_for_a_moment(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """slurmctld busy: the first three `scontrol` calls fail as a real one does (exit 1, Slurm's words);
    the start waits out those that come before the job starts, and the kernel starts."""
    import asyncio
    import shutil

    real = shutil.which("scontrol", path=slurm_cluster.env["PATH"])
    count = tmp_path / "count"
    wrapper = tmp_path / "bin" / "scontrol"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nn=$(($(cat "{count}" 2>/dev/null || echo 0) + 1)); echo $n > "{count}"\n'
                       'if [ $n -le 3 ]; then echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; '
                       f'exit 1; fi\nexec "{real}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    with in_process_manager(slurm_cluster, monkeypatch, f"{wrapper.parent}:{slurm_cluster.env['PATH']}") as (env, manager):
        async def scenario() -> None:
            await asyncio.wait_for(manager.start_kernel(env=env.environ, cwd=str(env.root)), START_TIMEOUT)
            try:
                # the first call fails at once, before the job can have started its kernel (one failure
                # ended the start before); how many more fail depends on how soon the job starts
                assert int(count.read_text()) >= 1
                assert await manager.is_alive()
            finally:
                await manager.shutdown_kernel(now=True)

        asyncio.run(scenario())
    assert slurm_cluster.job_ids() == []

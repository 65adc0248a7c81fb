"""The private Slurm of tests/slurm_cluster.py does what the Slurm tests rely on: GPUs granted by
index, the fake NVML inside a job's task, held jobs shown with their reason, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import GPUS, SlurmCluster, missing_slurm, private_cluster, slurm_cluster  # noqa: F401 (fixture)


def test_a_gres_request_grants_gpus_by_index(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.run(["srun", "--gres=gpu:2", "sh", "-c", 'echo "$SLURM_STEP_GPUS|$CUDA_VISIBLE_DEVICES"'])
    step_gpus, visible = done.stdout.strip().split("|")
    assert len(step_gpus.split(",")) == 2 and set(step_gpus.split(",")) <= {str(n) for n in range(GPUS)}
    assert visible == "0,1"


def test_a_task_sees_the_fake_gpus_only_through_the_wrapper(slurm_cluster: SlurmCluster) -> None:
    code = ("import json; from tfgpu_magic.gpus import inventory; found = inventory.read_inventory(); "
            "print(json.dumps([found.available, [gpu.uuid for gpu in found.gpus]]))")
    wrapped = slurm_cluster.run(["srun", "--gres=gpu:1", *slurm_cluster.fake_nvml_command([sys.executable, "-c", code])])
    available, uuids = json.loads(wrapped.stdout)
    assert available and len(uuids) == GPUS
    bare = slurm_cluster.run(["srun", sys.executable, "-c", code])
    assert json.loads(bare.stdout)[1] != uuids  # no NVML on this machine: the fake came from the wrapper


def test_the_wrapper_refuses_a_command_that_is_not_python(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.run(slurm_cluster.fake_nvml_command(["sh", "-c", "true"]), check=False)
    assert done.returncode != 0 and "expected PYTHON" in done.stderr


def test_a_held_job_waits_with_its_reason_until_released(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.run(["sbatch", "--parsable", "--hold", "--output=/dev/null", "--wrap", "sleep 60"]).stdout.strip()
    try:
        assert slurm_cluster.job_ids() == [job]
        assert slurm_cluster.job_field(job, "JobState") == "PENDING"
        assert slurm_cluster.run(["squeue", "-h", "-j", job, "-o", "%r"]).stdout.strip() == "JobHeldUser"
        slurm_cluster.run(["scontrol", "release", job])
        assert slurm_cluster.wait_job_state(job, "RUNNING") == "RUNNING"
    finally:
        slurm_cluster.cancel_all()
    assert slurm_cluster.job_ids() == [] and slurm_cluster.processes() == []


def test_a_cluster_stops_its_daemons_and_jobs_and_removes_its_folder() -> None:
    if missing_slurm():
        pytest.skip(missing_slurm())
    began = time.monotonic()
    with private_cluster() as cluster:
        started = time.monotonic() - began
        job = cluster.run(["sbatch", "--parsable", "--wrap", "sleep 300"]).stdout.strip()
        cluster.wait_job_state(job, "RUNNING")
        daemons = [cluster._pid(name) for name in cluster.daemons]
        running = cluster.processes()
        assert running  # the job's step and its sleep
    assert started < 30, f"the cluster took {started:.1f} s to start"
    assert not cluster.root.exists()
    for pid in [*daemons, *running]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def test_without_slurm_the_fixture_skips_but_fails_in_ci(tmp_path: Path) -> None:
    test = tmp_path / "test_needs_slurm.py"
    test.write_text("from slurm_cluster import slurm_cluster\n\ndef test_it(slurm_cluster):\n    pass\n", encoding="utf-8")
    tests_dir = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": tests_dir + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["SLURM_TESTS_SBIN"] = str(tmp_path)  # no /usr/sbin either: this machine has no Slurm, as far as the run knows
    for ci, outcome in (("", "1 skipped"), ("true", "1 error")):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(test)],
                              env={**env, "CI": ci}, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert outcome in done.stdout, done.stdout[-2000:]
        assert "no Slurm here" in done.stdout

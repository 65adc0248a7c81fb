"""A Slurm job's GPU grant read exactly: `SLURM_STEP_GPUS`/`SLURM_JOB_GPUS` (global IDs, the cards'
`/dev/nvidiaN` minor numbers) matched to NVML's minor numbers tell WHICH cards the job has, where its
`CUDA_VISIBLE_DEVICES=0,1` (no `CUDA_DEVICE_ORDER`) alone cannot: `visible auto[:N]` then ranks the
job's cards and pins its pick by UUID; an index (`visible 1`) still needs CUDA's order, which only a
one-card grant, PCI order or the CUDA driver (asked in a child, `gpus.cudaprobe`) tells.

The cards are tests/fake_nvml.py's `four_gpus` (minor numbers 0..3 unless a test says otherwise); the
CUDA driver is a fake `libcuda.so.1` built here with gcc (this machine has none): nothing here ran on
real CUDA or a real GPU. The last tests run `srun --gres=gpu:N` in the private Slurm of
tests/slurm_cluster.py and read the grant inside the job's task.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nvml import NVML_ERROR_NOT_SUPPORTED, UUIDS, FakeNvml, four_gpus
from fake_tf import FakeTF
from IPython.core.error import UsageError
from slurm_cluster import slurm_cluster  # noqa: F401  (the session's private Slurm, a fixture)

from tfgpu_magic.controller import Controller
from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus import cudaprobe
from tfgpu_magic.gpus.cudaenv import Grant, grant_of
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.gpus.slurm import MAX_GPUS, parse_ids, slurm_grant
from tfgpu_magic.jupyter import provisioner
from tfgpu_magic.serverext import gather
from tfgpu_magic.tf import quietimport
from tfgpu_magic.views.magics import TFGPUMagics
from tfgpu_magic.views.results import StatusResult
from tfgpu_magic.views.status import snapshot

INVENTORY = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
TODAYS_REFUSAL = ("visible auto: this kernel was granted 2 GPUs (CUDA_VISIBLE_DEVICES=0,1), by indices CUDA counts "
                  "in its default order (fastest first), not nvidia-smi's, so which card each is cannot be told; "
                  "name GPUs by UUID, or start the kernel with CUDA_DEVICE_ORDER=PCI_BUS_ID as well")


def job(cuda: str, gpus: str, variable: str = "SLURM_STEP_GPUS", **more: str) -> dict[str, str]:
    """A Slurm task's environment: `CUDA_VISIBLE_DEVICES=cuda`, Slurm's IDs `gpus`, job 1234."""
    return {"CUDA_VISIBLE_DEVICES": cuda, variable: gpus, "SLURM_JOB_ID": "1234",
            "SLURM_GPUS_ON_NODE": str(len(gpus.split(","))), **more}


def started_with(environ: dict[str, str], gpus: list | None = None) -> Controller:
    """A controller for a process started with `environ`, over NVML's `gpus` (the four cards)."""
    inventory = INVENTORY if gpus is None else read_inventory(Nvml(module=FakeNvml(gpus)))
    env = dict(environ)
    return Controller(api=FakeTF(4, imported=False, environ=env), environ=env, catalog=InventoryCatalog(inventory))


def edit(ctl: Controller, *lines: str) -> None:
    ctl.edit([ctl.parse(line) for line in lines])


@pytest.fixture(autouse=True)
def _clean():
    cudaprobe.forget()
    yield
    cudaprobe.forget()
    quietimport.disarm()
    assert "tensorflow" not in sys.modules


# ----- Slurm's record, read as hostile input --------------------------------------------------------
@pytest.mark.parametrize("raw, ids", [
    ("0,1", (0, 1)), (" 3 , 1 ", (3, 1)), ("0-3", (0, 1, 2, 3)), ("0,2-3", (0, 2, 3)), ("007", (7,)),
    (None, None), ("", None), ("NoDevFiles", None), ("1,,2", None), ("-1", None), ("3-1", None), ("1,1", None),
    ("0-1,1", None), ("1;2", None), ("0x1", None), ("٣", None), (f"0-{MAX_GPUS}", None), ("0-99999999", None),
    ("9" * 5000, (10**18,)), (",".join(map(str, range(MAX_GPUS + 1))), None),
])
def test_slurm_ids_are_read_as_slurm_writes_them_and_nothing_else(raw: str | None, ids: tuple | None) -> None:
    """Comma lists (what Slurm writes), ranges read anyway; anything else is no record, never a crash
    and never a huge expansion (a 5,000-digit ID is one ID no card has)."""
    found = parse_ids(raw)
    assert found == ids if raw != "9" * 5000 else found is not None and len(found) == 1 and found[0] > 10**17


def test_the_step_record_wins_and_the_count_must_agree() -> None:
    assert slurm_grant(job("0", "2", SLURM_JOB_GPUS="1,2")) == ("1234", (2,), "SLURM_STEP_GPUS")
    assert slurm_grant({"SLURM_JOB_GPUS": "1,2", "SLURM_JOB_ID": "77"}) == ("77", (1, 2), "SLURM_JOB_GPUS")
    assert slurm_grant(job("0,1", "0,1", SLURM_GPUS_ON_NODE="3")) is None
    assert slurm_grant(job("0,1", "0,1", SLURM_JOB_ID="12; rm -rf /")).job_id is None
    assert slurm_grant({"CUDA_VISIBLE_DEVICES": "0,1"}) is None


# ----- the grant ---------------------------------------------------------------------------------------
def test_two_cards_the_set_is_known_and_auto_picks_within_it_by_uuid() -> None:
    """Slurm gave cards 1 and 3 (`CUDA_VISIBLE_DEVICES=1,3`, its global IDs: no device cgroup). Was:
    `visible auto` refused; machine-wide it would take card 2 (tied with 1 on free memory, less busy)."""
    ctl = started_with(job("1,3", "1,3"))
    grant = ctl.grant()
    assert grant.card_set == (1, 3) and grant.source.job_id == "1234" and not grant.placed
    assert grant.granted_cards() == {1, 3} and [grant.gives(card) for card in range(4)] == [False, True, False, True]
    edit(ctl, "visible auto:1")
    assert ctl.policy.visible == (UUIDS[1],) and ctl.environ["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    edit(ctl, "visible auto:2")
    assert set(ctl.policy.visible) == {UUIDS[1], UUIDS[3]}
    with pytest.raises(PolicyError, match="this kernel was granted 2 GPUs"):
        edit(ctl, "visible auto:3")


def test_two_cards_an_index_still_needs_cudas_order() -> None:
    """`visible 1`: which card CUDA numbers 1 nothing here tells; today's refusal, word for word."""
    ctl = started_with(job("0,1", "0,1"))
    with pytest.raises(PolicyError) as raised:
        edit(ctl, "visible 1")
    assert str(raised.value) == TODAYS_REFUSAL.replace("visible auto:", "GPU 1:")
    assert ctl.policy.is_empty


def test_a_gpu_outside_the_job_is_refused_and_one_inside_is_taken_by_uuid() -> None:
    ctl = started_with(job("1,3", "1,3"))
    with pytest.raises(PolicyError, match="and this GPU is not among them"):
        edit(ctl, f"visible {UUIDS[2][:12]}")
    edit(ctl, f"visible {UUIDS[3][:12]}")
    assert ctl.policy.visible == (UUIDS[3],)


@pytest.mark.parametrize("cuda, gpus", [("2", "2"), ("0", "2")], ids=["global ID", "inside a device cgroup"])
def test_one_card_is_exact(cuda: str, gpus: str) -> None:
    """A grant of one card: every order numbers it 0, so `visible 0` is that card, by UUID."""
    ctl = started_with(job(cuda, gpus))
    assert ctl.grant() == Grant(cuda, (UUIDS[2],), (2,), (2,), slurm_grant(job(cuda, gpus)))
    edit(ctl, "visible 0")
    assert ctl.policy.visible == (UUIDS[2],)


def test_a_device_cgroup_showing_nvml_only_the_jobs_cards() -> None:
    """`ConstrainDevices=yes`: NVML lists the job's two cards (numbered 0 and 1 inside), their minor
    numbers still Slurm's IDs 1 and 3."""
    gpus = four_gpus(this_kernel=False)
    gpus[1].minor, gpus[3].minor = 1, 3
    ctl = started_with(job("0,1", "1,3"), [gpus[1], gpus[3]])
    assert ctl.grant().card_set == (0, 1)
    edit(ctl, "visible auto:1")
    assert ctl.policy.visible == (UUIDS[1],)


def test_a_device_cgroup_in_pci_order_ranks_the_jobs_cards_by_bus() -> None:
    """Inside a cgroup CUDA counts only the job's cards; in PCI order its 0 is the job's first by bus,
    even where NVML lists every card of the node."""
    grant = grant_of("1,0", "PCI_BUS_ID", INVENTORY, job("1,0", "2,3", CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    assert (grant.pins, grant.cards, grant.card_set) == ((UUIDS[3], UUIDS[2]), (3, 2), (2, 3))


def test_minor_numbers_unknown_take_a_list_of_the_jobs_size_only() -> None:
    unknown = {"nvmlDeviceGetMinorNumber": NVML_ERROR_NOT_SUPPORTED}
    refused = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)[1:3], fail=unknown)))
    assert {gpu.minor for gpu in refused.gpus} == {None}
    assert grant_of("0,1", None, refused, job("0,1", "5,6")).card_set == (0, 1)
    every = read_inventory(Nvml(module=FakeNvml(four_gpus(), fail=unknown)))
    assert grant_of("0,1", None, every, job("0,1", "0,1")) == Grant("0,1", (None, None), (None, None))


@pytest.mark.parametrize("environ", [
    job("0,1", "0,5"), job("0,1", "0,1,2"), job("1", "0,1"), job("0,2", "0,1"), job("0,1", "garbage"),
    job("0,1", "0," + "9" * 400), job(f"0,{UUIDS[1]}", "0,1"), job("0,1", "0-99999999"),
], ids=["no card of minor 5", "three IDs for two entries", "one entry for two IDs", "entries neither",
        "garbage", "a huge ID", "a UUID entry", "a huge range"])
def test_a_record_that_does_not_match_leaves_todays_grant_and_refusal(environ: dict[str, str]) -> None:
    """Slurm's record and what NVML lists (or what `CUDA_VISIBLE_DEVICES` says now) disagree: nothing
    tells which card is which, so the grant is what `CUDA_VISIBLE_DEVICES` alone makes, and `visible
    auto` refuses in today's one line; nothing changes."""
    ctl = started_with(environ)
    assert ctl.grant() == grant_of(environ["CUDA_VISIBLE_DEVICES"], None, INVENTORY)
    assert ctl.grant().source is None
    if environ["CUDA_VISIBLE_DEVICES"] == "0,1":
        with pytest.raises(PolicyError) as raised:
            edit(ctl, "visible auto")
        assert str(raised.value) == TODAYS_REFUSAL
    assert ctl.policy.is_empty and "CUDA_VISIBLE_DEVICES" not in ctl.plan().env_map


def test_the_status_names_the_job_and_marks_the_other_cards() -> None:
    text = StatusResult(snapshot(started_with(job("1,3", "1,3")))).text()
    assert ("Granted by Slurm job 1234, gres gpu:2: GPU 1, 3 (nvidia-smi numbering); CUDA's order among them is "
            "unknown: `visible auto` picks among them by UUID, an index is refused") in " ".join(text.split())
    lines = text.splitlines()
    marked = [lines[at - 1].split()[0] for at, line in enumerate(lines)
              if line == "       not this kernel's to take: outside its grant (Slurm job 1234, gres gpu:2)"]
    assert marked == ["0", "2"]
    one = StatusResult(snapshot(started_with(job("0", "2")))).text()
    assert "Granted by Slurm job 1234, gres gpu:1: GPU 2 (nvidia-smi numbering)\n" in one


def test_every_reader_of_the_grant_gets_slurms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server extension (its own environment) and the provisioner (the launch environment) see the
    job's cards as the magic does."""
    for name, value in job("1,3", "1,3").items():
        monkeypatch.setenv(name, value)
    assert gather.server_grant(INVENTORY).card_set == (1, 3)
    assert gather.Machine(INVENTORY, grant=gather.server_grant(INVENTORY)).granted() == {1, 3}
    granted = provisioner.granted_gpus(INVENTORY, "1,3", None, job("1,3", "1,3"))
    assert [gpu.uuid for gpu in granted.gpus] == [UUIDS[1], UUIDS[3]]
    assert provisioner.granted_gpus(INVENTORY, "1,3", None, {}) is None  # without the record: today's


def test_visible_auto_through_the_magic_on_a_real_shell(shell, monkeypatch: pytest.MonkeyPatch) -> None:
    """`%tfgpu visible auto:1` in IPython, in a Slurm task's environment: the job's freest card, by UUID;
    `%tfgpu visible 1` one line (a `UsageError`), changing nothing."""
    previous = shell.magics_manager.registry["TFGPUMagics"]
    ctl = started_with(job("1,3", "1,3"))
    shell.register_magics(TFGPUMagics(shell, controller=ctl))
    try:
        with pytest.raises(UsageError, match="^GPU 1: this kernel was granted 2 GPUs"):
            shell.run_line_magic("tfgpu", "visible 1")
        assert ctl.policy.is_empty
        shell.run_line_magic("tfgpu", "visible auto:1")
        assert ctl.policy.visible == (UUIDS[1],) and ctl.environ["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    finally:
        shell.register_magics(previous)


# ----- CUDA's own numbering, from the driver in a child ------------------------------------------------
FAKE_LIBCUDA = r"""
#include <stdio.h>
#include <stdlib.h>
/* FAKE_CUDA_DEVICES: the machine's devices in CUDA's own order (fastest first), 32 hex digits each,
   comma-separated; CUDA_VISIBLE_DEVICES (indices only) picks among them, stopping at a bad one. */
static char all[64][33];
static int order[64], count = -1, total;
static int setup(void) {
    const char *p = getenv("FAKE_CUDA_DEVICES"), *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (!p) return 100;
    for (total = 0; *p && total < 64; total++) {
        snprintf(all[total], 33, "%.32s", p);
        p += 32; if (*p == ',') p++;
    }
    count = 0;
    if (!visible) { for (int i = 0; i < total; i++) order[count++] = i; return 0; }
    for (p = visible; *p;) {
        char *end; long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= total) break;
        order[count++] = (int)v; p = end;
        if (*p != ',') break;
        p++;
    }
    return 0;
}
int cuInit(unsigned int flags) { return setup(); }
int cuDeviceGetCount(int *n) { *n = count; return 0; }
int cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal >= count) return 101;
    *device = ordinal;
    return 0;
}
int cuDeviceGetUuid_v2(unsigned char *uuid, int device) {
    for (int i = 0; i < 16; i++) {
        unsigned int byte;
        sscanf(all[order[device]] + 2 * i, "%2x", &byte);
        uuid[i] = byte;
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a fake `libcuda.so.1` (above), for a child's `LD_LIBRARY_PATH`."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the fake libcuda")
    folder = tmp_path_factory.mktemp("libcuda")
    (folder / "fake.c").write_text(FAKE_LIBCUDA, encoding="ascii")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(folder / "fake.c")],
                   check=True, capture_output=True, timeout=60)
    return folder


def cuda_machine(folder: Path, *cuda_order: int) -> dict[str, str]:
    """The environment of a process whose CUDA driver (the fake) numbers the four cards `cuda_order`."""
    hexes = ",".join(UUIDS[card].removeprefix("GPU-").replace("-", "") for card in cuda_order)
    return {"LD_LIBRARY_PATH": str(folder), "FAKE_CUDA_DEVICES": hexes, "PATH": "/usr/bin:/bin"}


def test_the_child_reads_cudas_numbering(fake_libcuda: Path) -> None:
    machine = cuda_machine(fake_libcuda, 0, 3, 2, 1)
    assert cudaprobe.ask_child("1,3", None, machine) == (UUIDS[3], UUIDS[1])
    assert cudaprobe.ask_child("2,9", None, machine) == (UUIDS[2],)  # CUDA stops at a device it lacks
    assert cudaprobe.ask_child("0", None, {"LD_LIBRARY_PATH": str(fake_libcuda)}) is None  # cuInit: no device


def test_the_driver_places_a_slurm_grant_in_cudas_order(fake_libcuda: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the driver answers, an index is a card: CUDA's 0 under `1,3` is card 3 (faster), asked once."""
    monkeypatch.setattr(cudaprobe, "driver_present", lambda: True)
    environ = {**job("1,3", "1,3"), **cuda_machine(fake_libcuda, 0, 3, 2, 1)}
    ctl = started_with(environ)
    assert ctl.grant() == Grant("1,3", (UUIDS[3], UUIDS[1]), (3, 1), (1, 3), slurm_grant(environ))
    edit(ctl, "visible 0")
    assert ctl.policy.visible == (UUIDS[3],)
    with monkeypatch.context() as patch:
        patch.setattr(cudaprobe, "ask_child", lambda *args: pytest.fail("asked twice"))
        assert ctl.grant().placed
    cudaprobe.forget()
    disagree = {**environ, **cuda_machine(fake_libcuda, 0, 2, 1, 3)}  # CUDA numbers cards 2 and 3 as its 1 and 3
    assert grant_of("1,3", None, INVENTORY, disagree) == grant_of("1,3", None, INVENTORY)


def test_no_driver_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an NVIDIA driver (this machine) the child is never started: the grant is Slurm's set."""
    monkeypatch.setattr(cudaprobe, "driver_present", lambda: False)
    monkeypatch.setattr(cudaprobe, "ask_child", lambda *args: pytest.fail("a child without a driver"))
    assert cudaprobe.cuda_uuids("0,1", None, {}) is None
    assert started_with(job("0,1", "0,1")).grant().card_set == (0, 1)


@pytest.mark.parametrize("stdout, expected", [
    ("tfgpu-cuda-order N uuids 0a6f8c2e1d3b4c5a9e7f112233445566\n", (UUIDS[0],)),
    ("noise\ntfgpu-cuda-order N uuids \n", ()),
    ("tfgpu-cuda-order N no-driver\n", None), ("tfgpu-cuda-order N failed\n", None),
    ("tfgpu-cuda-order OTHER uuids 0a6f8c2e1d3b4c5a9e7f112233445566\n", None),
    ("tfgpu-cuda-order N uuids 0A6F8C2E1D3B4C5A9E7F112233445566\n", None),
    ("tfgpu-cuda-order N uuids 0a6f8c2e\n", None), ("tfgpu-cuda-order N uuids a,b extra\n", None),
    ("tfgpu-cuda-order N uuids " + ",".join(["0" * 32] * 65) + "\n", None), ("", None),
])
def test_the_childs_answer_is_read_only_from_its_own_framed_line(stdout: str, expected) -> None:
    assert cudaprobe.parse_answer(stdout, "N") == expected


# ----- a real Slurm --------------------------------------------------------------------------------
TASK = """
import json, os
from tfgpu_magic.controller import get_controller
from tfgpu_magic.views.status import describe_status
env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "CUDA_"))}  # as srun started the task
ctl = get_controller()
grant = ctl.grant()
picked = None
try:
    ctl.edit([ctl.parse("visible auto:1")])
    picked = ctl.policy.visible
except Exception as err:
    picked = str(err)
print("RESULT " + json.dumps({"env": env,
      "card_set": grant.card_set, "pins": grant.pins, "job": grant.source and grant.source.job_id,
      "picked": picked, "status": describe_status(ctl)}))
"""


def run_in_job(cluster, gres: str) -> dict:
    """`srun --gres=gres` a task that reads its grant over the four fake cards; what it printed."""
    task = cluster.fake_nvml_command([sys.executable, "-c", TASK])
    done = cluster.run(["srun", f"--gres={gres}", "-n1", "-c1", *task], timeout=120)
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_srun_two_gpus_the_grant_read_exactly_inside_the_task(slurm_cluster) -> None:  # noqa: F811
    """In a real job step: Slurm's own variables, the job's two cards named, `visible auto:1` picking the
    freer of them (card 1; machine-wide it would be card 2) by UUID."""
    found = run_in_job(slurm_cluster, "gpu:2")
    env = found["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SLURM_STEP_GPUS"] == "0,1" and "CUDA_DEVICE_ORDER" not in env
    assert found["card_set"] == [0, 1] and found["pins"] == [None, None] and found["job"] == env["SLURM_JOB_ID"]
    assert found["picked"] == [UUIDS[1]]
    assert f"Granted by Slurm job {env['SLURM_JOB_ID']}, gres gpu:2: GPU 0, 1" in found["status"]


def test_srun_one_gpu_is_placed_exactly(slurm_cluster) -> None:  # noqa: F811
    found = run_in_job(slurm_cluster, "gpu:1")
    assert found["env"]["SLURM_STEP_GPUS"] == "0" and found["pins"] == [UUIDS[0]] and found["picked"] == [UUIDS[0]]

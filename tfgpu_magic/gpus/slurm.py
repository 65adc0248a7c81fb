"""A Slurm job's own record of the GPUs it was granted, and the cards NVML lists for it (pure: the
environment and the inventory are given).

Slurm hands a job step its GPUs twice: `CUDA_VISIBLE_DEVICES` (indices CUDA counts in its own order,
relative to the device cgroup where `ConstrainDevices=yes`), and `SLURM_STEP_GPUS` (`SLURM_JOB_GPUS` in
a batch or interactive job's own step): global GPU IDs, the number N of each card's `/dev/nvidiaN`
(gres.conf's `File=`), which NVML reports as the card's minor number, "not relative to any device
cgroup" (srun(1), https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES). The
second tells exactly WHICH cards the job has, whatever NVML lists (every card of the node, or only the
job's); not which of them is CUDA's index 0: CUDA's default order puts the fastest first and leaves
"the order of the rest of the devices unspecified" (the CUDA Programming Guide's CUDA_DEVICE_ORDER).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from ..envvars import SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, SLURM_JOB_ID, SLURM_STEP_GPUS
from ..language.policy import whole_number
from .inventory import Gpu, Inventory

MAX_GPUS = 256
"""More IDs than this in one record is no node's (NVIDIA's minor numbers stop at 254, 255 being
/dev/nvidiactl): such a record is not read, and a range like `0-99999999` is never expanded."""
MAX_JOB_ID_CHARS = 20


class SlurmGrant(NamedTuple):
    """What Slurm says this process's job step was given on this node."""

    job_id: str | None
    """`SLURM_JOB_ID` (digits only; None where it is missing or odd)."""
    gpus: tuple[int, ...]
    """The global GPU IDs (`/dev/nvidiaN` minor numbers), in Slurm's order."""
    variable: str
    """Which variable said so: `SLURM_STEP_GPUS` or `SLURM_JOB_GPUS`."""

    def cards(self, inventory: Inventory) -> tuple[Gpu, ...] | None:
        """NVML's cards for `gpus`, in nvidia-smi order: each ID matched to the one card of that minor
        number. Where NVML cannot tell minor numbers (Not Supported, an older binding), only a list of
        exactly as many cards as the grant is taken (a device cgroup showing NVML the job's cards, or a
        job holding the whole node). None where the IDs and the cards do not match (an ID no card has,
        two cards of one number, no inventory)."""
        if not inventory.available or not inventory.gpus:
            return None
        if all(gpu.minor is None for gpu in inventory.gpus):
            return inventory.gpus if len(inventory.gpus) == len(self.gpus) else None
        found = []
        for wanted in self.gpus:
            matches = [gpu for gpu in inventory.gpus if gpu.minor == wanted]
            if len(matches) != 1:
                return None
            found.append(matches[0])
        return tuple(sorted(found, key=lambda gpu: gpu.index))

    def matches(self, entries: tuple[str, ...]) -> bool:
        """Whether `CUDA_VISIBLE_DEVICES`'s `entries` are the ones Slurm wrote for this grant: as many
        indices as GPUs, being either its global IDs (no device cgroup) or 0..n-1 (counted inside the
        job's cgroup), in any order. Anything else was set by someone after Slurm."""
        numbers = [whole_number(entry) for entry in entries]
        if None in numbers or len(numbers) != len(self.gpus):
            return False
        return set(numbers) in (set(self.gpus), set(range(len(self.gpus))))


def parse_ids(raw: str | None) -> tuple[int, ...] | None:
    """`0,1,3` (what Slurm writes) or ranges like `0-3` (never seen from Slurm, read anyway) as IDs;
    None for anything else: an empty value, `NoDevFiles` (a gres without device files), garbage, a
    repeated ID, more than `MAX_GPUS`."""
    if raw is None or not raw.strip():
        return None
    ids: dict[int, None] = {}
    for token in raw.split(","):
        first, dash, last = token.strip().partition("-")
        low, high = whole_number(first), whole_number(last) if dash else whole_number(first)
        if low is None or high is None or high < low or high - low >= MAX_GPUS:
            return None
        for number in range(low, high + 1):
            if number in ids or len(ids) >= MAX_GPUS:
                return None
            ids[number] = None
    return tuple(ids)


def slurm_grant(environ: Mapping[str, str]) -> SlurmGrant | None:
    """The job step's GPU record from `environ`; None outside a Slurm job, or where the record is not a
    clean list of IDs, or disagrees with `SLURM_GPUS_ON_NODE`'s count."""
    variable = SLURM_STEP_GPUS if environ.get(SLURM_STEP_GPUS, "").strip() else SLURM_JOB_GPUS
    ids = parse_ids(environ.get(variable))
    if ids is None:
        return None
    count = environ.get(SLURM_GPUS_ON_NODE)
    if count is not None and whole_number(count.strip()) != len(ids):
        return None
    job = environ.get(SLURM_JOB_ID, "").strip()
    return SlurmGrant(job if job.isascii() and job.isdigit() and len(job) <= MAX_JOB_ID_CHARS else None,
                      ids, variable)

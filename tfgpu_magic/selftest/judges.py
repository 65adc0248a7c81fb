"""The selftest's judges: each turns the figures a child reported (and its stderr) into a verdict,
what was expected and what was measured. Pure: they never read TensorFlow, JAX, PyTorch or NVML
themselves, so tests can judge figures that tests/fake_tf.py, tests/fake_torch.py and
tests/fake_nvml.py produce."""

from __future__ import annotations

from typing import Any, Mapping

from ..doctor import FAIL as DOCTOR_FAIL
from ..doctor import INFO, OK, WARN
from ..envvars import (C_SPACES, PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, XLA_CLIENT_MEM_FRACTION,
                       XLA_PYTHON_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_PREALLOCATE, alloc_conf_entries)
from ..language.sizes import bytes_text, mib_text
from ..tf.quietimport import severity
from .records import FAIL, MIB, SKIP, Judge, Machine, Outcome, Prepared, Probe, verdict

CPU_SPLIT = 3
OVERHEAD_MIB = 1024
"""What a process may hold on a card beyond its cap: the CUDA context, cuBLAS/cuDNN workspaces."""
GROWTH_SHARE = 0.25
"""With growth on, a process that made a 1 MiB tensor holds less than this share of the card."""
GREEDY_SHARE = 0.75
"""Without growth, TensorFlow takes at least this share of the memory free when it started
(GPUProcessState leaves only a small reserve)."""
ASYNC_LINE = "Using CUDA malloc Async allocator for GPU"
"""What TensorFlow logs at INFO when it builds the cuda_malloc_async allocator
(tensorflow/core/common_runtime/gpu/gpu_process_state.cc)."""
BELOW_ERROR = ("debug", "info", "warning")
FRACTION_SLACK = 1e-6
"""How far PyTorch's fraction read back may be from the one given: its cudaMallocAsync backend answers
its limit, rounded down to bytes, over the card's total (CUDAMallocAsyncAllocator.cpp, getMemoryFraction)."""
TORCH_ASYNC = "cudaMallocAsync"
"""PyTorch's name for CUDA's stream-ordered allocator: `backend:cudaMallocAsync` in its configuration picks
it, `torch.cuda.get_allocator_backend()` then says it (torch/cuda/memory.py). Written here from PyTorch,
not taken from the plan: the rule checks the plan against PyTorch."""


# ----- judges: TensorFlow on the CPU ------------------------------------------------------------------------
def judge_baseline(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    build = "CUDA build" if f["cuda_build"] else "CPU-only build"
    return verdict(True, "TensorFlow imports and runs a first op",
                   f"TensorFlow {f['version']} ({build}), {f['cpus']} logical CPU(s), {f['gpus']} GPU(s); "
                   f"{len(probe.stderr)} line(s) on stderr")


def judge_cpu_split(count: int) -> Judge:
    """Only what was measured: the CPUs TensorFlow lists after the policy (or the cell's error, and
    then no count at all), never whether TensorFlow took the policy."""

    def judge(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
        f = probe.figures or {}
        if f.get("error"):
            return Outcome(FAIL, "the cell raised an error, so no logical CPU was counted", f"{count} logical CPUs",
                           f"error in the cell: {f['error']}")
        return verdict(f["cpus"] == count, f"{count} logical CPUs", f"{f['cpus']}",
                       f"TensorFlow lists {f['cpus']} logical CPU(s) after the policy, not {count}")

    return judge


def judge_visible_none(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    without = _baseline(machine, "gpus")
    trivial = ("TensorFlow lists no GPU here without a policy either: this shows only that the policy does no harm"
               if without == 0 else "")
    return verdict(f["gpus"] == 0 and f["logical_gpus"] == 0,
                   "no GPU" + (f" (without a policy: {without})" if without is not None else ""),
                   f"{f['gpus']} GPU(s); CUDA_VISIBLE_DEVICES={f['cuda_visible_devices']!r}",
                   "TensorFlow still lists GPUs", trivial)


def judge_device_routes(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    counts = (f["device_lib"], f["session_with_config"], f["session"])
    return verdict(counts == (CPU_SPLIT,) * 3,
                   f"{CPU_SPLIT} CPU devices from each of device_lib.list_local_devices(), "
                   "Session(config=ConfigProto()) and Session()",
                   "device_lib {}, Session(config) {}, Session() {}".format(*counts),
                   "a route that creates devices outside the eager context lists another number of CPU devices")


def judge_locked(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    before = _baseline(machine, "cpus") or 1
    named = [line for line in f["locked"] if "CPU" in line]
    ok = f["initialized"] and not f["ok"] and bool(named) and len(f["warnings"]) == 1 and f["cpus"] == before
    return verdict(ok, f"runtime seen as initialized; one warning naming the CPU split as locked; still {before} "
                       "logical CPU(s)",
                   f"initialized: {'yes' if f['initialized'] else 'no'}; "
                   f"locked: {'; '.join(f['locked']) or 'nothing'}; "
                   f"{len(f['warnings'])} warning(s); {f['cpus']} logical CPU(s)",
                   "an initialized runtime went unnoticed, or a locked setting was not named")


def judge_quiet_import(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    """`loglevel error`: no log line below error may remain of those TensorFlow printed in the run
    without a policy; errors, and lines that are not log lines (yours, Python's warnings), stay."""
    baseline = machine.baseline
    if baseline is None or baseline.figures is None:
        return Outcome(SKIP, "the run without a policy, which this rule counts against, failed", "", "")
    hideable = [line for line in baseline.stderr if severity(line) in BELOW_ERROR]
    if not hideable:
        return Outcome(SKIP, "without a policy TensorFlow printed no log line below error on stderr here: nothing "
                       "to hide", "", f"{len(baseline.stderr)} line(s) without a policy")
    left = [line for line in probe.stderr if severity(line) in BELOW_ERROR]
    kept = sum(severity(line) in ("error", "fatal") for line in probe.stderr)
    others = len(probe.stderr) - len(left) - kept
    return verdict(not left, f"none of the {len(hideable)} log line(s) below error TensorFlow printed without a policy",
                   f"{len(left)} left" + (f", e.g. {left[0][:120]}" if left else "")
                   + f"; kept: {kept} error line(s), {others} other line(s)",
                   "TensorFlow's log lines below error still reach stderr")


# ----- judges: NVML only --------------------------------------------------------------------------------------
def judge_inventory(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    gpus = f["gpus"]
    complete = bool(gpus) and all(gpu["uuid"].startswith(("GPU-", "MIG-")) and gpu["total_mib"] for gpu in gpus)
    listed = "; ".join(f"GPU {g['index']} {g['name']} {mib_text(g['total_mib'])} {g['uuid']}" for g in gpus)
    return verdict(f["error"] is None and complete, "every GPU with its UUID and total memory",
                   f"driver {f['driver']}: {listed}" if gpus else f"no GPU: {f['error']}",
                   "NVML's inventory is missing GPUs' UUIDs or memory")


def judge_visible_auto(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    free = {uuid: mib for uuid, mib in f["free"].items() if mib is not None}
    most = max(free.values(), default=None)
    chosen = f["visible"]
    ok = len(chosen) == 1 and free.get(chosen[0]) == most and f["cuda_visible_devices"] == chosen[0]
    return verdict(ok, f"one GPU with the most free memory ({mib_text(most)} free), pinned by its UUID",
                   f"visible {','.join(chosen) or 'none'} ({mib_text(free.get(chosen[0]) if chosen else None)} free); "
                   f"CUDA_VISIBLE_DEVICES={f['cuda_visible_devices']!r}",
                   "`visible auto` did not pin the freest GPU")


def judge_limit_percent(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    half = {index: total / 2 for index, total in f["totals"].items() if total}
    limits = f["limits"]
    ok = bool(half) and set(limits) == set(half) and all(abs(limits[i] - half[i]) <= 1 for i in half)
    return verdict(ok, "half of each card: " + ", ".join(f"GPU {i} {mib:.0f} MiB" for i, mib in half.items()),
                   ", ".join(f"GPU {i} {mib} MiB" for i, mib in limits.items()) or "no limit",
                   "`limit 50%` did not give half of each card's total")


def judge_who(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    rows = {row["pid"]: row["gpu_memory"] for row in f["who"]}
    missing = [p for p in f["nvml"] if str(p["gpu"]) not in rows.get(p["pid"], {})
               or rows[p["pid"]][str(p["gpu"])] != (None if p["mib"] is None else p["mib"] * MIB)]
    return verdict(not missing, f"each of the {len(f['nvml'])} process(es) NVML lists on a GPU, with its memory",
                   f"{len(f['nvml']) - len(missing)} listed as NVML says"
                   + (f"; missing or different: {missing[:3]}" if missing else ""),
                   "`who` does not show what NVML shows")


def judge_doctor(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    checks = (probe.figures or {})["checks"]
    counts = {name: sum(check["verdict"] == name for check in checks) for name in (OK, WARN, DOCTOR_FAIL, INFO)}
    known = sum(counts.values()) == len(checks)
    return verdict(bool(checks) and known, "every check gives a verdict (its own findings are the doctor's)",
                   f"{len(checks)} checks: " + ", ".join(f"{n} {name}" for name, n in counts.items() if n),
                   "the doctor gave no checks, or a verdict it does not define",
                   "`%tfgpu doctor` explains its FAIL and warn lines" if counts[DOCTOR_FAIL] or counts[WARN] else "")


# ----- judges: JAX and PyTorch --------------------------------------------------------------------------------
def judge_jax(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    """What JAX's GPU backend is given as its backends start (jaxlib's reader of the `XLA_*` variables,
    or what JAX's CUDA plugin really got); on a GPU, each device's allocator limit within the share."""
    f = probe.figures or {}
    fraction = prepared.args["fraction"]
    expected = "as JAX's backends start: preallocate false" + (f", memory_fraction {fraction:g}" if fraction else "")
    if fraction:
        expected += f"; on a GPU, an allocator limit of at most {mib_text(fraction * prepared.args['total_mib'])}"
    if f["started_at_import"]:
        return Outcome(FAIL, "JAX's backends had started by the end of `import jax`, before the policy's variables",
                       expected, "backends started at import")
    if f["error"]:
        return Outcome(FAIL, "jaxlib refused its variables as the backends started", expected, f["error"])
    options = f["given"] or f["options"]
    if options is None:
        return Outcome(SKIP, "this jaxlib has no generate_pjrt_gpu_plugin_options, the reader this rule asks", expected,
                       f"JAX {f['version']}")
    preallocate, share = options.get("preallocate"), options.get("memory_fraction")
    said = {False: "false", True: "true", None: "unset (JAX's default: true)"}[preallocate]
    source = "given to JAX's CUDA plugin" if f["given"] else "jaxlib read at backend start"
    measured = (f"{source}: preallocate {said}, "
                f"memory_fraction {'unset' if share is None else f'{share:g}'}, allocator {options.get('allocator')}")
    started_right = preallocate is False and (not fraction or share == fraction)
    held = True
    notes = []
    if f["gpus"] and fraction:
        limits = [card["bytes_limit"] for card in f["gpus"]]
        cap = (fraction * prepared.args["total_mib"] + 1) * MIB  # + 1 MiB: NVML gives the total in whole MiB
        held = all(limit is not None and limit <= cap for limit in limits)
        measured += "; allocator limit on the card: " + ", ".join(map(bytes_text, limits))
    elif not f["gpus"]:
        platforms = ", ".join(f["platforms"])
        notes.append(f"JAX lists no GPU here (its platforms: {platforms}): this reads what its GPU backend would "
                     "be given; no card's limit was measured")
    if not fraction:
        notes.append(f"no limit was tried (a share of a card's total needs NVML: {prepared.args['no_limit']})")
    fractions = (XLA_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_MEM_FRACTION) if fraction else ()
    notes.append(_inherited(f["env"], (XLA_PYTHON_CLIENT_PREALLOCATE, *fractions), machine))
    why_fail = ("JAX's backends started without the policy's settings" if not started_right
                else "JAX's allocator may take more than the policy's share of the card")
    return verdict(started_right and held, expected, measured, why_fail, "; ".join(note for note in notes if note))


def judge_torch(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    """The allocator configuration as torch's C library loads and as torch's reader parses it; the
    policy's one call queued for CUDA's start with a per-device fraction; on a GPU, after a first CUDA
    call, the backend and the fraction torch reports."""
    f = probe.figures or {}
    fraction = prepared.args["fraction"]
    names = (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF)
    expected = (f"backend:{TORCH_ASYNC} in {' and '.join(names)} as torch's C library loads and in what torch's reader "
                "parses; CUDA not started by the import")
    if fraction:
        expected += f"; one call queued for CUDA's start, giving device 0 the fraction {fraction:g}"
    loaded, settings, gpu = f["at_load"], f["settings"], f["gpu"]
    measured = ("as torch._C loaded: " + ", ".join(f"{name}={loaded.get(name)!r}" for name in names)
                if loaded is not None else "torch._C was not seen loading")
    measured += (f"; torch's reader: {settings!r}" if settings is not None
                 else "; this torch has no _accelerator_getAllocatorSettings")
    measured += f"; CUDA {'started' if f['cuda_started'] else 'not started'} by the import"
    ok = (loaded is not None and all(_names_async(loaded.get(name)) for name in names)
          and (settings is None or _names_async(settings)) and not f["cuda_started"])
    notes = []
    if fraction:
        given = ", ".join(f"device {device} {share:g}" for device, share in f["fractions"].items()) or "nothing"
        measured += f"; {f['queued']} call(s) queued for CUDA's start, giving {given}"
        ok = ok and f["queued"] == 1 and f["fractions"] == {"0": fraction}
    else:
        notes.append(f"no limit was tried (a share of a card's total needs NVML: {prepared.args['no_limit']})")
    if gpu is None:
        build = " (a CPU-only build)" if f["cuda_build"] is None else ""
        notes.append(f"PyTorch sees no GPU here{build}: its fraction after CUDA's start was not read")
    elif "error" in gpu:
        measured += f"; its first CUDA call failed: {gpu['error']}"
        ok = False
    else:
        read = ", ".join(f"device {device} {share:g}" for device, share in gpu["fractions"].items())
        measured += f"; after a first CUDA call: backend {gpu['backend']}, fraction {read}"
        ok = ok and gpu["backend"] == TORCH_ASYNC and (
            not fraction or abs(gpu["fractions"].get("0", 1.0) - fraction) <= FRACTION_SLACK)
    notes.append(_inherited(loaded or {}, names, machine))
    return verdict(ok, expected, measured, "PyTorch did not get the policy's allocator or fraction",
                   "; ".join(note for note in notes if note))


def _names_async(conf: str | None) -> bool:
    """Whether an allocator configuration (`key:value,...`) picks the cudaMallocAsync backend, its entries
    split as PyTorch splits them (`envvars.alloc_conf_entries`)."""
    return any(key == "backend" and entry.partition(":")[2].strip(C_SPACES) == TORCH_ASYNC
               for key, entry in alloc_conf_entries(conf or ""))


def _inherited(seen: Mapping[str, str | None], names: tuple[str, ...], machine: Machine) -> str:
    """Where the selftest's own environment already held what a child saw: then the rule shows only
    that the policy keeps it."""
    same = [name for name in names if seen.get(name) is not None and machine.environ.get(name) == seen[name]]
    return f"{', '.join(same)} as inherited: this shows only that the policy keeps it" if same else ""


# ----- judges: GPUs --------------------------------------------------------------------------------------------
NOT_LISTED = ("NVML does not list this process on the card (in a container NVML may show the host's process "
              "ids): its memory there cannot be read")


def mine(figures: dict[str, Any], uuid: str, key: str = "cards") -> dict[str, Any] | None:
    """The card `uuid` in `figures[key]`, when NVML lists this process on it."""
    card = figures[key].get(uuid)
    return card if card is not None and card["listed"] and card["mine_mib"] is not None else None


def judge_visible_gpus(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    wanted = sorted(prepared.args["uuids"])
    used = sorted(uuid for uuid, card in f["cards"].items() if card["listed"])
    if not used:
        return Outcome(SKIP, NOT_LISTED, ", ".join(wanted), f"TensorFlow lists {f['tf_gpus']} GPU(s)")
    return verdict(used == wanted and f["tf_gpus"] == len(wanted),
                   f"TensorFlow on exactly {', '.join(wanted)}",
                   f"TensorFlow lists {f['tf_gpus']} GPU(s); NVML shows this process on {', '.join(used)}",
                   "the process runs on other cards than the policy chose")


def judge_growth(on: bool) -> Judge:
    def judge(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
        f = probe.figures or {}
        uuid = prepared.args["uuid"]
        card = mine(f, uuid, "after")
        if card is None:
            return Outcome(SKIP, NOT_LISTED, "", "")
        held, total, free = card["mine_mib"], card["total_mib"], f["before"][uuid]["free_mib"]
        measured = f"{mib_text(held)} of the card's {mib_text(total)} ({mib_text(free)} free before)"
        if on:
            return verdict(held < total * GROWTH_SHARE, f"under {mib_text(total * GROWTH_SHARE)} after a 1 MiB tensor",
                           measured, "with growth on the process holds a quarter of the card or more")
        return verdict(held >= free * GREEDY_SHARE,
                       f"at least {mib_text(free * GREEDY_SHARE)} (nearly all that was free)",
                       measured, "without growth TensorFlow should take nearly all free memory")

    return judge


def judge_limit(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    mib = prepared.args["mib"]
    card = mine(f, prepared.args["uuid"])
    held = card["mine_mib"] if card else None
    expected = f"an allocation of {mib_text(mib * 1.5)} fails; the process holds at most {mib_text(mib + OVERHEAD_MIB)}"
    measured = f"{'ResourceExhaustedError' if f['oom'] else 'no error'}; holds {mib_text(held)}"
    if f["oom"] and card is None:
        return Outcome(SKIP, NOT_LISTED, expected, measured)
    return verdict(f["oom"] and held <= mib + OVERHEAD_MIB, expected, measured,
                   "the cap did not hold" if not f["oom"] else "the process holds more than the cap and its overhead")


def judge_split_gpu(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    mib = prepared.args["mib"]
    return verdict(f["logical_gpus"] == 2 and f["oom"] and bool(f["second_fits"]),
                   f"2 logical GPUs of {mib_text(mib)}: {mib_text(mib * 1.5)} fails on the first, "
                   f"{mib_text(mib / 2)} fits on the second",
                   f"{f['logical_gpus']} logical GPU(s); {'ResourceExhaustedError' if f['oom'] else 'no error'} on the "
                   f"first; second {'fits' if f['second_fits'] else 'not tried'}",
                   "TensorFlow did not split the card as asked")


def judge_allocator(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    said = [line for line in probe.stderr if ASYNC_LINE in line]
    return verdict(bool(said), f"TensorFlow logs \"{ASYNC_LINE}\"",
                   said[0].split("] ", 1)[-1] if said else "no such line on stderr",
                   "TensorFlow did not log that it built the async allocator")


def judge_memory_info(probe: Probe, prepared: Prepared, machine: Machine) -> Outcome:
    f = probe.figures or {}
    tensors, wanted = f["tensors_bytes"], prepared.args["mib"] * MIB
    card = mine(f, prepared.args["uuid"])
    pool = card["mine_mib"] * MIB if card else None
    expected = f"TensorFlow counts at least {mib_text(wanted / MIB)} of tensors, and NVML shows at least that"
    measured = (f"tensors {mib_text(None if tensors is None else tensors / MIB)}; "
                f"NVML {mib_text(None if pool is None else pool / MIB)}")
    if card is None:
        return Outcome(SKIP, NOT_LISTED, expected, measured)
    return verdict(tensors is not None and wanted <= tensors <= pool, expected, measured,
                   "get_memory_info and NVML disagree")


def _baseline(machine: Machine, key: str) -> Any:
    baseline = machine.baseline
    return None if baseline is None or baseline.figures is None else baseline.figures[key]

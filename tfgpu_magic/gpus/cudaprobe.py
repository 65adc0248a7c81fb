"""CUDA's own numbering of `CUDA_VISIBLE_DEVICES`, asked of the CUDA driver in a short-lived child
process: the UUID of each device CUDA would number 0, 1, … under a given value and order.

Which card an index names in CUDA's default order (fastest first) nothing else tells; the driver
does. It is asked in a child so that this process's CUDA is never initialized (CUDA reads
`CUDA_VISIBLE_DEVICES` once, at its start: a kernel must keep that moment for its policy), as nvitop
does (https://github.com/XuehaiPan/nvitop, nvitop/api/device.py, `_parse_cuda_visible_devices`). The
child loads `libcuda.so.1` with ctypes (`cuInit`, `cuDeviceGetCount`, `cuDeviceGet`,
`cuDeviceGetUuid_v2`, else `cuDeviceGetUuid`), prints one framed line and exits; it has a deadline,
and its answer is kept for the life of this process. Without an NVIDIA driver it is never started.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from typing import Mapping

from ..envvars import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES
from .inventory import driver_present

TIMEOUT_SECONDS = 20.0
"""How long the child may take (cuInit on eight cards takes about a second; a wedged driver longer)."""
MAX_DEVICES = 64
"""More devices in an answer than this is no answer."""
MARK = "tfgpu-cuda-order"

CHILD = r"""
import ctypes, sys
nonce = sys.argv[1]
def say(text):
    print(f"tfgpu-cuda-order {nonce} {text}", flush=True)
    sys.exit(0)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    say("no-driver")
if cuda.cuInit(0) != 0:
    say("no-devices")
count = ctypes.c_int(0)
if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
    say("failed")
get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
uuids = []
for ordinal in range(count.value):
    device = ctypes.c_int(0)
    raw = (ctypes.c_ubyte * 16)()
    if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or get_uuid(raw, device) != 0:
        say("failed")
    uuids.append(bytes(raw).hex())
say("uuids " + ",".join(uuids))
"""
"""The child's program (`python -I -S -c CHILD nonce`): the standard library only."""

_answers: dict[tuple[str, str | None], tuple[str, ...] | None] = {}


def cuda_uuids(value: str, order: str | None, environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPU UUIDs (`GPU-…`, lower case) CUDA numbers 0, 1, … in a process started with
    `CUDA_VISIBLE_DEVICES=value` and `CUDA_DEVICE_ORDER=order` (unset: None), the rest of its
    environment `environ`; None where there is no NVIDIA driver or the child gives no answer. Asked
    once per value and order in this process."""
    key = (value, order)
    if key not in _answers:
        _answers[key] = ask_child(value, order, environ) if driver_present() else None
    return _answers[key]


def ask_child(value: str, order: str | None, environ: Mapping[str, str],
              timeout: float = TIMEOUT_SECONDS) -> tuple[str, ...] | None:
    """Run the child (module docstring) under `environ` with the given CUDA variables; its answer, or
    None (no driver, no device, a failure, past `timeout`, output not ours)."""
    env = {name: text for name, text in environ.items() if name not in (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)}
    env[CUDA_VISIBLE_DEVICES] = value
    if order is not None:
        env[CUDA_DEVICE_ORDER] = order
    nonce = secrets.token_hex(8)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, nonce], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_answer(done.stdout, nonce)


def parse_answer(stdout: str, nonce: str) -> tuple[str, ...] | None:
    """The UUIDs in the child's framed line (`tfgpu-cuda-order <nonce> uuids <hex>,<hex>`); None for
    any other answer, a line without this run's nonce, or a malformed UUID. Zero devices is `()`."""
    for line in stdout.splitlines():
        words = line.split(" ")
        if len(words) < 3 or words[0] != MARK or words[1] != nonce:
            continue
        if words[2:3] != ["uuids"] or len(words) > 4:
            return None
        raw = words[3].split(",") if len(words) == 4 and words[3] else []
        if len(raw) > MAX_DEVICES or not all(len(hexa) == 32 and _is_hex(hexa) for hexa in raw):
            return None
        return tuple(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" for h in raw)
    return None


def _is_hex(text: str) -> bool:
    return all(char in "0123456789abcdef" for char in text)


def forget() -> None:
    """Drop the answers kept (tests; a process whose driver changed)."""
    _answers.clear()

"""The records a kernel publishes (`jupyter.kernelstate`), as `tfgpu-state.schema.json` (beside this file)
defines them: the policy, TensorFlow's state and memory, the changes that wait; data, not words (clients
word it), built from the controller's records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..language.policy import AUTO_PICKED
from ..language.sizes import MIB

if TYPE_CHECKING:
    from ..language.policy import Policy
    from ..tf.apply import Pending
    from ..tf.initcell import InitRecord
    from ..tf.memory import GpuMemory
    from ..tf.runtime import RuntimeState


PUBLISHED_STAGES = {"devices_created": "imported"}
"""`$defs/tensorflowState` has no stage of its own for GPU devices created by a route (TensorFlow is
imported, its runtime not initialized); every other `tf.runtime.Stage` is published as it is."""


def tensorflow_state(state: RuntimeState) -> str:
    """`$defs/tensorflowState`: `RuntimeState.stage` as the schema's enum has it."""
    return PUBLISHED_STAGES.get(state.stage, state.stage)


def policy_record(policy: Policy) -> dict[str, Any]:
    """`$defs/policy`: the policy field by field, sizes in bytes."""
    written = dict(policy.limits_written)
    return {
        "visible": None if policy.visible is None else list(policy.visible),
        "visible_auto": policy.picked_automatically,
        "growth": policy.growth,
        "limits": [{"gpu": gpu, "bytes": mib * MIB, "written": written.get(gpu)} for gpu, mib in policy.limits],
        "limits_share": policy.limits_share,
        "splits": [{"gpu": gpu, "bytes": [mib * MIB for mib in sizes]} for gpu, sizes in policy.splits],
        "cpu_devices": policy.cpu_devices,
        "allocator": policy.allocator,
        "loglevel": policy.loglevel,
    }


KEPT_PICK = AUTO_PICKED + "before the restart"
"""The note on a `visible auto` pick that a restart carried over (its figures are the old kernel's)."""


def policy_from_record(record: dict[str, Any]) -> Policy:
    """The `Policy` a checked `policy_record` describes (the server keeps it for the next kernel);
    `PolicyError` when it is not a valid policy."""
    from ..language.policy import Policy

    limits = tuple((item["gpu"], item["bytes"] // MIB) for item in record["limits"])
    return Policy.from_dict({
        "visible": record["visible"], "growth": record["growth"], "limits": dict(limits),
        "splits": {item["gpu"]: [size // MIB for size in item["bytes"]] for item in record["splits"]},
        "cpu_devices": record["cpu_devices"], "allocator": record["allocator"], "loglevel": record["loglevel"],
    }).edited(limits_written=tuple((item["gpu"], item["written"]) for item in record["limits"] if item["written"]),
              limits_share=record["limits_share"], sources=(("visible", KEPT_PICK),) if record["visible_auto"] else ())


def setting_value(value: Any) -> Any:
    """`$defs/settingValue` of a `Change`'s `current` or `desired`: logical configurations (a tuple of
    memory limits in MiB, None or `LogicalSpec` entries) as logical devices in bytes; flags, device
    names and variable values as they are."""
    if not isinstance(value, tuple):
        return list(value) if isinstance(value, list) else value
    devices = []
    for entry in value:
        if isinstance(entry, tuple):  # a LogicalSpec: (memory_limit, priority, ordinal)
            limit, priority, ordinal = (tuple(entry) + (None, None))[:3]
            devices.append({"memory": None if limit is None else limit * MIB, "priority": priority, "ordinal": ordinal})
        else:
            devices.append({"memory": None if entry is None else entry * MIB})
    return devices


def pending_record(item: Pending) -> dict[str, Any]:
    """`$defs/pendingChange`."""
    change = item.change
    return {"setting": change.setting, "device": change.device, "now": setting_value(change.current),
            "wanted": setting_value(change.desired), "why": item.why, "needs_restart": item.needs_restart}


def init_record(record: InitRecord | None) -> dict[str, Any] | None:
    """`$defs/tensorflow/initialized_by`."""
    return None if record is None else {"where": record.where, "execution_count": record.execution_count,
                                        "line": record.line}


def tensorflow_memory(rows: list[GpuMemory]) -> list[dict[str, Any]]:
    """`$defs/tensorflow/memory`: TensorFlow's figures per visible GPU (`tf.memory.memory_rows`), once its
    runtime is initialized."""
    return [{"device": row.tf_device, "card": row.uuid or row.gpu, "current": row.tensors_bytes, "peak": row.peak_bytes}
            for row in rows if row.tensors_bytes is not None and row.peak_bytes is not None]

"""The routes that create devices outside the eager context (`device_lib.list_local_devices`,
`tf.test.is_gpu_available`, TF1 sessions), wrapped so that they use the policy too, reversibly.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from ..errors import short_error
from .apply import ConfigAPI, Route
from .runtime import WRAPPED, CreatedBy, where

def merge_session_config(user: Any | None, policy: Any | None, api: ConfigAPI) -> tuple[Any | None, str | None]:
    """The config a route should create devices with, and a warning when the user's GPU options win.

    The GPU options are taken as a whole (TF checks them together: virtual devices against
    visible_device_list and per_process_gpu_memory_fraction in VerifyVirtualDeviceSettings,
    gpu_device.cc); the CPU count is taken unless the user's config has one."""
    if policy is None or user is None:
        return (policy if user is None else user), None
    merged = api.new_session_config()
    merged.CopyFrom(user)
    wins = []
    wanted = policy.gpu_options.ListFields()
    if wanted and not user.gpu_options.ListFields():
        merged.gpu_options.CopyFrom(policy.gpu_options)
    elif wanted and user.gpu_options != policy.gpu_options:
        names = ", ".join(f.name for f, _ in user.gpu_options.ListFields())
        wins.append(f"the config's own gpu_options ({names}) win over the policy's for the GPU devices it "
                    "creates; they stay fixed until restart")
    if "CPU" in policy.device_count and "CPU" not in user.device_count:
        merged.device_count["CPU"] = policy.device_count["CPU"]
    elif "CPU" in policy.device_count and user.device_count["CPU"] != policy.device_count["CPU"]:
        wins.append(f"the config's own CPU device count ({user.device_count['CPU']}) wins over the policy's "
                    f"({policy.device_count['CPU']}) in this session")
    return merged, "; ".join(wins) or None


CALLERS = {"is_gpu_available": "tf.test.is_gpu_available()", "gpu_device_name": "tf.test.gpu_device_name()"}
"""tf.test functions that call device_lib.list_local_devices() (framework/test_util.py), named in the state."""


def install_routes(api: ConfigAPI, policy_config: Callable[[], Any | None]) -> None:
    """Make every device-creating route use the policy (`policy_config()`, None for none) and record
    that GPU devices were created. Re-installing replaces our wrapper; `uninstall_routes` undoes it."""
    for route in api.device_routes():
        current = getattr(route.owner, route.attribute, None)
        if current is None:
            continue
        original = getattr(current, WRAPPED, current)
        setattr(route.owner, route.attribute, _wrap(route, original, api, policy_config))


def uninstall_routes(api: ConfigAPI) -> None:
    """Put TensorFlow's own functions back."""
    for route in api.device_routes():
        current = getattr(route.owner, route.attribute, None)
        if hasattr(current, WRAPPED):
            setattr(route.owner, route.attribute, getattr(current, WRAPPED))


def _wrap(route: Route, original: Callable, api: ConfigAPI, policy_config: Callable[[], Any | None]) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        positional = len(args) > route.position
        given = args[route.position] if positional else kwargs.get(route.keyword)
        label = CALLERS.get(sys._getframe(1).f_code.co_name, route.label)
        config = given
        if given is not None or route.fill_default:
            try:
                policy = policy_config()
            except Exception as err:  # the policy must never break the user's own call
                print(f"tfgpu_magic: {label}: the policy was not passed on: {err}", file=sys.stderr)
                policy = None
            config, warning = merge_session_config(given, policy, api)
            if warning:
                print(f"tfgpu_magic: {label}: {warning}", file=sys.stderr)
        if positional:
            args = (*args[:route.position], config, *args[route.position + 1:])
        elif config is not None:
            kwargs[route.keyword] = config
        try:
            result = original(*args, **kwargs)
        except api.errors() as err:  # C++ side, e.g. "Not enough GPUs to create virtual devices"
            used = "its own config" if given is not None else "the policy's options"
            print(f"tfgpu_magic: {label} could not create devices with {used}: {short_error(err, None)}", file=sys.stderr)
            raise
        if api.state().devices_created is None and route.gpus_created(result, args):
            api.record_devices_created(CreatedBy(label, where()))
        return result

    setattr(wrapper, WRAPPED, original)
    return wrapper

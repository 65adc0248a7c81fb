"""`tfgpu-provisioner`: kernelspecs whose policy is resolved at each launch, through jupyter_client's
`KernelManager` and the real entry point (installed by `pip install -e`).

The provisioner runs in this process (KernelManager calls it here), so the fake 4-GPU inventory is
injected at `provisioner.read_inventory`; the kernels are real ipykernel processes, and the policy
they get is checked from inside them, real TensorFlow (CPU) included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterator

import pytest
from fake_nvml import MIG_UUIDS, UUIDS, FakeNvml, four_gpus
from jupyter_client import KernelManager
from faults_support import SERVER_APP, bounded, hold_lock, opened_by, server_env
from servers import JupyterEnv, isolated_jupyter

from tfgpu_magic.errors import PolicyError
from tfgpu_magic.gpus import reservations
from tfgpu_magic.gpus.inventory import Inventory, Nvml, read_inventory
from tfgpu_magic.jupyter import provisioner
from tfgpu_magic.jupyter.startup import POLICY_ENV
from tfgpu_magic.language.policy import Policy

START_TIMEOUT = 120.0


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[JupyterEnv]:
    with isolated_jupyter() as jupyter:
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(jupyter.runtime_dir))
        yield jupyter


def _spec(env: JupyterEnv, name: str, policy: Policy, visible: str | None = None) -> None:
    directory = env.kernels_dir / name
    directory.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--ext=tfgpu_magic"],
        "display_name": name, "language": "python", "env": {},
        "metadata": {"kernel_provisioner": provisioner.provisioner_metadata(policy, visible), "tfgpu_magic": {}},
    }  # fmt: skip
    (directory / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


def _start(env: JupyterEnv, name: str, **extra: str) -> KernelManager:
    manager = KernelManager(kernel_name=name, kernel_spec_manager=env.kernelspec_manager(),
                            connection_file=str(env.runtime_dir / f"kernel-{name}-{threading.get_ident()}.json"))
    manager.start_kernel(env={**env.environ, **extra})
    return manager


def _ask(manager: KernelManager, expression: str) -> Any:
    """`expression`'s value inside the kernel (its repr, evaluated here)."""
    outputs: list[dict[str, Any]] = []
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=START_TIMEOUT)
        reply = client.execute_interactive(f"print(repr({expression}))", timeout=START_TIMEOUT, output_hook=outputs.append)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    text = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
    return eval(text)  # noqa: S307 (a repr printed by our own kernel)


def _kernel_environ(env: JupyterEnv, name: str, **extra: str) -> dict[str, str]:
    """The CUDA_* and TFGPU_* variables a kernel launched from spec `name` starts with."""
    manager = _start(env, name, **extra)
    try:
        return _ask(manager, "{k: v for k, v in __import__('os').environ.items() if k.startswith(('CUDA_', 'TFGPU_'))}")
    finally:
        _stop(manager)


def _stop(manager: KernelManager) -> None:
    if manager.has_kernel:
        manager.shutdown_kernel(now=True)


def _fake(inventory: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provisioner, "read_inventory", lambda: inventory)


def test_the_entry_point_is_installed_and_names_a_tfgpu_provisioner() -> None:
    found = {ep.name: ep for ep in entry_points(group="jupyter_client.kernel_provisioners")}
    assert provisioner.NAME.startswith("tfgpu") and found[provisioner.NAME].load() is provisioner.TFGPUProvisioner
    assert issubclass(provisioner.TFGPUProvisioner, __import__("jupyter_client").provisioning.LocalProvisioner)


def test_two_simultaneous_auto_launches_land_on_different_gpus(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    _spec(env, "tf-auto", Policy(growth=True), "auto")
    barrier = threading.Barrier(2)
    managers: list[KernelManager] = []
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            barrier.wait(10)
            managers.append(_start(env, "tf-auto"))
        except BaseException as err:  # noqa: BLE001 (reported by the test thread)
            errors.append(err)

    threads = [threading.Thread(target=launch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(START_TIMEOUT)
    try:
        assert not errors and len(managers) == 2
        assert all(isinstance(m.provisioner, provisioner.TFGPUProvisioner) for m in managers)
        seen = [_ask(m, "__import__('os').environ.get('CUDA_VISIBLE_DEVICES')") for m in managers]
        assert sorted(seen) == sorted([UUIDS[1], UUIDS[2]])  # the two freest cards, one each
        policies = [_ask(m, f"__import__('os').environ['{POLICY_ENV}']") for m in managers]
        assert sorted(json.loads(p)["visible"][0] for p in policies) == sorted(seen)
        assert all(json.loads(p)["growth"] is True for p in policies)
        placed = _ask(managers[0], f"__import__('os').environ['{provisioner.PLACED_ENV}']")
        assert placed.startswith("auto picked GPU ")
        live = reservations.current(env.runtime_dir)
        assert sorted(g for r in live for g in r.gpus) == sorted(seen)
        assert sorted(r.kernel_pid for r in live) == sorted(m.provisioner.pid for m in managers)

        from tfgpu_magic.holders import who

        rows = {row.pid: row for row in who(Inventory(error="no NVML here"), env.runtime_dir)}
        assert all(rows[m.provisioner.pid].placed.startswith("auto picked GPU ") for m in managers)

        before = seen[0]
        managers[0].restart_kernel(now=True)
        assert _ask(managers[0], "__import__('os').environ.get('CUDA_VISIBLE_DEVICES')") == before
        assert len(reservations.current(env.runtime_dir)) == 2
    finally:
        for manager in managers:
            _stop(manager)
    assert reservations.current(env.runtime_dir) == []
    assert list(env.runtime_dir.glob(f"{reservations.PREFIX}*")) == []


def test_a_reservation_of_an_ended_launcher_is_ignored(env: JupyterEnv) -> None:
    from servers import dead_pid

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    first = reservations.reserve("k1", 1, inventory, env.runtime_dir)
    assert first.gpus == (UUIDS[2],)
    second = reservations.reserve("k2", 1, inventory, env.runtime_dir)
    assert second.gpus == (UUIDS[1],)
    reservations.set_kernel_pid(first, dead_pid())
    assert reservations.reserve("k3", 1, inventory, env.runtime_dir).gpus == (UUIDS[2],)
    assert not first.path.exists()


def test_the_pick_and_its_record_are_one_step_under_the_lock(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight launchers at once, each slowed between ranking and recording: still four distinct cards
    first, then each card twice (the lock, not luck, keeps them apart)."""
    import time

    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    rank = reservations.rank
    monkeypatch.setattr(reservations, "rank", lambda *args: (time.sleep(0.05), rank(*args))[1])
    barrier = threading.Barrier(8)
    picked: list[str] = []

    def launch(n: int) -> None:
        barrier.wait(10)
        picked.extend(reservations.reserve(f"k{n}", 1, inventory, env.runtime_dir).gpus)

    threads = [threading.Thread(target=launch, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(picked) == sorted(UUIDS * 2)


OLD_SERVER = """
import asyncio, json, os, sys
sys.path.insert(0, {tests!r})
from fake_nvml import FakeNvml, four_gpus
from tfgpu_magic.gpus.inventory import Nvml, read_inventory
from tfgpu_magic.jupyter import provisioner
from tfgpu_magic.language.policy import Policy
provisioner.read_inventory = lambda: read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
launcher = provisioner.TFGPUProvisioner(kernel_id="k-saved", policy=Policy(growth=True).to_dict(), visible="auto")
launcher.resolve()
launcher.pid = os.getppid()  # its kernel, which outlives this server: the test process stands for it
asyncio.run(launcher.post_launch())
print(json.dumps(asyncio.run(launcher.get_provisioner_info())))
"""
"""A server process that launches kernel k-saved with `visible auto` (fake NVML), prints the
provisioner info it would save, and exits."""


def test_a_saved_pick_comes_back_in_a_new_provisioner(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server that picked GPU 2 saved its provisioner info (as JSON) and is gone; the kernel runs
    on. A new provisioner loads that info: the same pick without reading the inventory again, the
    reservation live again (this process its launcher), so the next launch gets another card; a
    restart keeps the pick; the kernel's end removes the record."""
    run = subprocess.run([sys.executable, "-c", OLD_SERVER.format(tests=str(Path(__file__).parent))],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    saved = json.loads(run.stdout)
    assert reservations.current(env.runtime_dir) == []  # its launcher has ended: the record no longer counts

    def no_second_pick() -> Inventory:
        raise AssertionError("the restored provisioner read the inventory again")

    monkeypatch.setattr(provisioner, "read_inventory", no_second_pick)
    restored = provisioner.TFGPUProvisioner(policy=Policy(growth=True).to_dict(), visible="auto")
    asyncio.run(restored.load_provisioner_info(saved))
    assert (restored.kernel_id, restored.pid) == ("k-saved", os.getpid())
    assert restored.resolve() == (Policy(growth=True, visible=(UUIDS[2],)), None)
    [live] = reservations.current(env.runtime_dir)
    assert (live.kernel_id, live.gpus, live.launcher_pid, live.kernel_pid) == ("k-saved", (UUIDS[2],), os.getpid(),
                                                                               os.getpid())
    assert live.why.startswith("auto picked GPU 2 (")
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    assert reservations.reserve("k-next", 1, inventory, env.runtime_dir).gpus == (UUIDS[1],)
    asyncio.run(restored.cleanup(restart=True))
    assert restored.resolve() == (Policy(growth=True, visible=(UUIDS[2],)), None)
    assert reservations.path_for("k-saved", env.runtime_dir).exists()
    asyncio.run(restored.cleanup(restart=False))
    assert [r.kernel_id for r in reservations.current(env.runtime_dir)] == ["k-next"]
    assert not reservations.path_for("k-saved", env.runtime_dir).exists()


def test_a_saved_warning_comes_back_without_a_reservation(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch without NVML: every GPU visible and the warning; both come back from the saved info."""
    _fake(Inventory(error="NVML unavailable: no NVIDIA driver here"), monkeypatch)
    launcher = provisioner.TFGPUProvisioner(kernel_id="k1", policy=Policy(cpu_devices=2).to_dict(), visible="auto")
    launcher.resolve()
    saved = json.loads(json.dumps(asyncio.run(launcher.get_provisioner_info())))
    assert saved[provisioner.INFO_KEY]["reservation"] is None
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)  # NVML back: no new pick
    restored = provisioner.TFGPUProvisioner(visible="auto")
    asyncio.run(restored.load_provisioner_info(saved))
    assert restored.resolve() == (Policy(cpu_devices=2), "visible auto: no GPU inventory at launch (NVML unavailable: "
                                  "no NVIDIA driver here); the kernel starts with the GPUs it inherits")
    assert reservations.current(env.runtime_dir) == []


BASE_INFO = {"kernel_id": "k1", "connection_info": {}, "pid": None, "pgid": None, "ip": None}
"""What `LocalProvisioner.get_provisioner_info` saves for a kernel not launched."""


@pytest.mark.parametrize("pick", [
    None,
    {"policy": {"growth": "yes"}, "warning": None, "reservation": None},
    {"policy": None, "warning": None, "reservation": {"kernel_id": "k1", "path": "/tmp/k1.json"}},
    {"policy": None, "warning": None, "reservation": {"kernel_id": "k1", "gpus": "GPU-0", "why": "", "launcher_pid": 1,
                                                      "kernel_pid": None, "created": 0.0, "directory": "/tmp"}},
], ids=["none-saved", "bad-policy", "other-keys", "gpus-not-a-list"])
def test_info_without_a_pick_of_ours_leaves_the_next_launch_to_pick(
        env: JupyterEnv, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, pick: dict | None) -> None:
    """Info saved by `LocalProvisioner` (or an older tfgpu_magic) loads as before; a pick this
    provisioner would not have written is logged in one line and ignored: the launch picks anew."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    restored = provisioner.TFGPUProvisioner(visible="auto")
    with caplog.at_level(logging.WARNING):
        asyncio.run(restored.load_provisioner_info(BASE_INFO if pick is None else {**BASE_INFO, provisioner.INFO_KEY: pick}))
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    if pick is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith("tfgpu-provisioner: ")
        assert warnings[0].endswith("; the next launch picks again") and "\n" not in warnings[0]
    assert restored.kernel_id == "k1" and restored.resolve() == (Policy(visible=(UUIDS[2],)), None)
    assert [r.kernel_id for r in reservations.current(env.runtime_dir)] == ["k1"]
    asyncio.run(restored.cleanup())
    assert reservations.current(env.runtime_dir) == []


def test_without_nvml_visible_auto_launches_with_a_warning_for_the_first_cell(
        env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(Inventory(error="NVML unavailable: no NVIDIA driver here"), monkeypatch)
    _spec(env, "tf-auto", Policy(), "auto:2")
    environ = _kernel_environ(env, "tf-auto")
    assert "CUDA_VISIBLE_DEVICES" not in environ
    assert environ[provisioner.WARNING_ENV] == (
        "visible auto: no GPU inventory at launch (NVML unavailable: no NVIDIA driver here); "
        "the kernel starts with the GPUs it inherits")
    assert reservations.current(env.runtime_dir) == []


def test_auto_picks_only_among_the_gpus_a_scheduler_granted(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm or a device plugin set CUDA_VISIBLE_DEVICES for the server: `auto` stays inside that grant."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    _spec(env, "tf-auto", Policy(), "auto")
    environ = _kernel_environ(env, "tf-auto", CUDA_VISIBLE_DEVICES=f"0,{UUIDS[3]}", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert environ["CUDA_VISIBLE_DEVICES"] == UUIDS[0]  # 60 GB free beats 40


@pytest.mark.parametrize("grant, order, picked", [
    ("1,2", "PCI_BUS_ID", 2), (f"{UUIDS[0][:12]},{UUIDS[3]}", None, 0), (MIG_UUIDS[1], None, None),
], ids=["indices-in-pci-order", "gpu-uuids", "mig-uuid"])
def test_the_launch_picks_within_the_launching_grant(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch,
                                                     grant: str, order: str | None, picked: int | None) -> None:
    """The pick at launch ranks only the granted GPUs (`gpus.cudaenv.Grant`, as the magic's `visible
    auto`): GPU 2 beats 1 on busyness, GPU 0's 60 GB free beat GPU 3's 40, a MIG instance is its own pick."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    launch = provisioner.TFGPUProvisioner(visible="auto", kernel_id="k1")
    policy, warning = launch.resolve(grant, order)
    assert warning is None and policy.visible == (MIG_UUIDS[1] if picked is None else UUIDS[picked],)
    assert [r.gpus for r in reservations.current(env.runtime_dir)] == [policy.visible]
    asyncio.run(launch.cleanup())
    assert reservations.current(env.runtime_dir) == []


def test_a_grant_by_index_in_cudas_default_order_is_kept_as_it_is(env: JupyterEnv,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`CUDA_VISIBLE_DEVICES=2` without `CUDA_DEVICE_ORDER=PCI_BUS_ID` (Slurm's way): which card CUDA
    counts as 2 is not nvidia-smi's to tell, so `auto` picks nothing, the kernel keeps the grant and its
    order (no PCI_BUS_ID, which would make it another card), and its first cell says why."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    _spec(env, "tf-auto", Policy(growth=True), "auto")
    environ = _kernel_environ(env, "tf-auto", CUDA_VISIBLE_DEVICES="2")
    assert environ["CUDA_VISIBLE_DEVICES"] == "2" and "CUDA_DEVICE_ORDER" not in environ
    assert environ[provisioner.WARNING_ENV].startswith(
        "visible auto: the launch environment sets CUDA_VISIBLE_DEVICES='2', which names GPUs the inventory cannot place")
    assert reservations.current(env.runtime_dir) == []


def test_a_runtime_dir_that_refuses_the_record_does_not_stop_the_kernel(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted link at the lock file: the pick is not recorded, the kernel starts with a warning."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    (env.runtime_dir / reservations.LOCK_NAME).symlink_to(env.root / "elsewhere")
    _spec(env, "tf-auto", Policy(), "auto")
    environ = _kernel_environ(env, "tf-auto")
    assert "CUDA_VISIBLE_DEVICES" not in environ and not (env.root / "elsewhere").exists()
    assert environ[provisioner.WARNING_ENV].startswith("visible auto: could not record the pick in the runtime dir")


def test_a_held_lock_bounds_the_wait_of_a_pick(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holding the reservation lock forever: the pick gives up after `LOCK_WAIT`
    with one `PolicyError` line, and records nothing."""
    monkeypatch.setattr(reservations, "LOCK_WAIT", 0.3)
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    with hold_lock(env.runtime_dir / reservations.LOCK_NAME), pytest.raises(PolicyError) as info:
        bounded(lambda: reservations.reserve("k1", 1, inventory, env.runtime_dir), 30)
    assert "held by another process" in str(info.value) and "\n" not in str(info.value)
    assert reservations.current(env.runtime_dir) == []


def test_a_plain_manager_launches_despite_a_held_lock(env: JupyterEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a `KernelManager` (nbclient, papermill, `jupyter console`) the launch waits a bounded
    time, then the kernel starts with every GPU and the warning for its first cell."""
    _fake(read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False)))), monkeypatch)
    monkeypatch.setattr(reservations, "LOCK_WAIT", 0.3)
    _spec(env, "tf-auto", Policy(), "auto")
    with hold_lock(env.runtime_dir / reservations.LOCK_NAME):
        environ = bounded(lambda: _kernel_environ(env, "tf-auto"), START_TIMEOUT)
    assert "CUDA_VISIBLE_DEVICES" not in environ
    warning = environ[provisioner.WARNING_ENV]
    assert warning.startswith("visible auto: could not record the pick in the runtime dir") and "held by" in warning


def test_a_held_lock_never_freezes_a_jupyter_server(env: JupyterEnv) -> None:
    """The server's provisioner (fake NVML in the server process: tests/faults_support.py) waits on
    the lock another process holds, off the server's event loop: the server answers /api/status and
    /api/kernels within 1 s meanwhile, and the kernel then starts with the warning."""
    from servers import running_server, wait_until

    _spec(env, "tf-auto", Policy(), "auto")
    server_env(env.environ)
    lock = env.runtime_dir / reservations.LOCK_NAME
    with running_server(env, app=SERVER_APP) as server:
        launched: dict[str, Any] = {}
        with hold_lock(lock):
            thread = threading.Thread(target=lambda: launched.update(id=server.create_kernel("tf-auto")), daemon=True)
            thread.start()
            wait_until(lambda: opened_by(server.process.pid, lock), START_TIMEOUT, "the launch at the reservation lock",
                       interval=0.02)
            for path in ("api/status", "api/kernels"):
                assert answered_within(server, path, 1.0), f"{path} did not answer within 1 s"
            thread.join(START_TIMEOUT)
        assert "id" in launched, server.log_tail()
        kernel = server.connect(launched["id"])
        warning = kernel.evaluate(f"__import__('os').environ.get('{provisioner.WARNING_ENV}')")
        assert warning.startswith("visible auto: could not record the pick in the runtime dir") and "held by" in warning


def answered_within(server: Any, path: str, seconds: float, tries: int = 5) -> bool:
    """Whether `GET path` is answered within `seconds` in one of `tries` attempts (a server whose event
    loop is blocked answers none; a busy machine may delay one)."""
    for _ in range(tries):
        try:
            server.request("GET", path, timeout=seconds)
            return True
        except OSError:  # urllib's timeout (a URLError or TimeoutError)
            continue
    return False


def test_a_grant_narrows_the_choice_unless_it_names_an_unknown_gpu() -> None:
    """Indices are nvidia-smi's only in PCI order; a MIG instance is granted as itself, on its card."""
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus(this_kernel=False))))
    assert provisioner.granted_gpus(inventory, None) is inventory
    assert provisioner.granted_gpus(inventory, "MIG-1234").gpus == ()  # CUDA stops at a UUID no card has
    assert provisioner.granted_gpus(inventory, "2,1,2") is None  # CUDA's default order: which cards, unknown
    assert [g.index for g in provisioner.granted_gpus(inventory, "2,1,2", "PCI_BUS_ID").gpus] == [2, 1]
    (mig,) = provisioner.granted_gpus(inventory, MIG_UUIDS[1][:12]).gpus
    assert (mig.index, mig.uuid, mig.memory_total_mib) == (3, MIG_UUIDS[1], 9856)


def test_the_policy_is_in_force_before_the_first_cell(env: JupyterEnv) -> None:
    """Real TensorFlow (CPU): the first cell imports it and already sees the two logical CPUs."""
    _spec(env, "tf-cpu2", Policy(cpu_devices=2))
    manager = _start(env, "tf-cpu2")
    try:
        devices = _ask(manager, "[d.name for d in __import__('tensorflow').config.list_logical_devices('CPU')]")
    finally:
        _stop(manager)
    assert devices == ["/device:CPU:0", "/device:CPU:1"]


def test_a_jupyter_server_launches_through_the_provisioner_too(env: JupyterEnv) -> None:
    """JupyterLab's launcher and JupyterHub's single-user server start kernels this way (POST
    api/kernels); the server's own process runs the provisioner, found by its entry point. No NVML
    there: `visible auto` still starts the kernel, with the warning for its first cell."""
    from servers import running_server

    _spec(env, "tf-auto-cpu2", Policy(cpu_devices=2), "auto")
    with running_server(env) as server:
        assert "tf-auto-cpu2" in server.kernelspecs()
        with server.kernel("tf-auto-cpu2") as kernel:
            environ = kernel.evaluate("{k: v for k, v in __import__('os').environ.items() if k.startswith('TFGPU_')}")
            assert environ[provisioner.WARNING_ENV].startswith("visible auto: no GPU inventory at launch")
            assert json.loads(environ[POLICY_ENV])["cpu_devices"] == 2
            assert kernel.evaluate("len(__import__('tensorflow').config.list_logical_devices('CPU'))") == 2


def test_a_bad_provisioner_config_is_one_policy_error() -> None:
    with pytest.raises(PolicyError, match="auto or auto:N"):
        provisioner.provisioner_metadata(Policy(), "0,1")
    with pytest.raises(PolicyError, match="COUNT"):
        provisioner.auto_count("auto:zero")
    assert provisioner.provisioner_metadata(Policy(), "auto:2")["config"] == {"policy": Policy().to_dict(), "visible": "auto:2"}

"""The scripts the selftest's rules run, each in a fresh `python -c SCRIPT ARGUMENT`, kept as text.

Text, because they import TensorFlow, JAX or PyTorch and only the child that runs one may: the
selftest's own process (a kernel's child) stays free of them (each fixes its device settings once
started), and tests/test_architecture.py keeps every `import tensorflow` of the package's modules in
tfgpu_magic/tf/. Each script gets `POLICY` (directives) and `ARGS` (the rule's values) from its one
argument, applies the policy through the public API (`tfgpu_magic.configure` before the import, or
`%tfgpu` in a real IPython shell), does what the rule needs with the real framework, and ends with
`report(...)`: one line framed with the run's nonce on stdout (`frames`: nothing else printed there
counts). Its stderr is the parent's to read. When its stdin reaches EOF, the selftest that started
it is gone, and it kills its own process group (`children`).
"""

from __future__ import annotations

from . import frames

PRELUDE = f"""\
import json, os, sys, threading
_root, POLICY, ARGS, _nonce = json.loads(sys.argv[1])
if _root not in sys.path:  # the parent's tfgpu_magic, wherever this process starts
    sys.path.append(_root)

def _end_when_orphaned():
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    os.killpg(os.getpgrp(), 9)

threading.Thread(target=_end_when_orphaned, daemon=True).start()

def _load_frames():  # by its path: importing the package would import tfgpu_magic, which the baseline must not
    import importlib.util
    spec = importlib.util.spec_from_file_location("_tfgpu_selftest_frames", {frames.__file__!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

_frames = _load_frames()

def report(**figures):
    sys.stdout.flush()
    _frames.write(_nonce, figures)
"""

POLICY_FIRST = """\
import tfgpu_magic
tfgpu_magic.configure(*POLICY)
"""
"""The policy through the public API, before any framework is imported."""

CONFIGURE = POLICY_FIRST + """\
tf = __import__("tensorflow")  # run by the child only; no line of the package itself imports TensorFlow
"""

FIRST_OP = """\
tf.constant(1) + 1
report(version=tf.__version__, cuda_build=bool(tf.test.is_built_with_cuda()),
       cpus=len(tf.config.list_logical_devices("CPU")),
       gpus=len(tf.config.list_physical_devices("GPU")), logical_gpus=len(tf.config.list_logical_devices("GPU")),
       cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), python=sys.executable,
       python_version=sys.version.split()[0])
"""

BASELINE = "import tensorflow as tf\n" + FIRST_OP
"""No policy, no tfgpu_magic: what this TensorFlow does by itself (devices, stderr lines at import)."""

CONFIGURED = CONFIGURE + FIRST_OP
"""The policy through `configure()`, then `import tensorflow` and a first op."""

SAME_CELL = """\
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "tfgpu_magic")
for line in POLICY:
    shell.run_line_magic("tfgpu", line)
cell = shell.run_cell("import tensorflow as tf\\ncpus = len(tf.config.list_logical_devices('CPU'))")
failure = cell.error_in_exec or cell.error_before_exec
report(cpus=shell.user_ns.get("cpus"), error=None if failure is None else f"{type(failure).__name__}: {failure}")
"""

DEVICE_ROUTES = CONFIGURE + """\
device_lib = __import__("tensorflow.python.client.device_lib", fromlist=["device_lib"])

def cpus(devices):
    return sum(device.device_type == "CPU" for device in devices)

listed = cpus(device_lib.list_local_devices())
with tf.Graph().as_default():
    given = cpus(tf.compat.v1.Session(config=tf.compat.v1.ConfigProto()).list_devices())
    default = cpus(tf.compat.v1.Session().list_devices())
report(device_lib=listed, session_with_config=given, session=default)
"""

LOCKED = """\
import warnings
tf = __import__("tensorflow")  # run by the child only; no line of the package itself imports TensorFlow
tf.constant(1) + 1
import tfgpu_magic
from tfgpu_magic import get_controller
from tfgpu_magic.views.status import change_text
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    applied = tfgpu_magic.configure(*POLICY)
report(initialized=get_controller().state().initialized, ok=applied.ok, locked=[change_text(c) for c in applied.locked],
       warnings=[str(warning.message) for warning in caught], cpus=len(tf.config.list_logical_devices("CPU")))
"""

# ----- NVML only: no TensorFlow in these ------------------------------------------------------------
INVENTORY = """\
from tfgpu_magic.gpus.inventory import read_inventory
inventory = read_inventory()
report(error=inventory.error, driver=inventory.driver_version,
       gpus=[{"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "total_mib": gpu.memory_total_mib}
             for gpu in inventory.gpus])
"""

VISIBLE_AUTO = """\
import tfgpu_magic
from tfgpu_magic.gpus.inventory import cached_inventory
tfgpu_magic.configure(*POLICY)
report(visible=list(tfgpu_magic.current_policy().visible or ()),
       cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
       free={gpu.uuid: gpu.memory_free_mib for gpu in cached_inventory().gpus})  # the read `auto` picked from
"""

LIMIT_PERCENT = """\
import tfgpu_magic
from tfgpu_magic.gpus.inventory import cached_inventory
tfgpu_magic.configure(*POLICY)
report(limits=dict(tfgpu_magic.current_policy().limits),
       totals={str(gpu.index): gpu.memory_total_mib for gpu in cached_inventory().gpus})
"""

WHO = """\
import tfgpu_magic
from tfgpu_magic.gpus.inventory import read_inventory
from tfgpu_magic.selftest.measure import processes
inventory = read_inventory()
report(nvml=processes(inventory), who=[{"pid": row["pid"], "gpu_memory": row["gpu_memory"]}
                                       for row in tfgpu_magic.who(inventory)])
"""

DOCTOR = """\
from tfgpu_magic.views.actions import doctor
from tfgpu_magic import get_controller
report(checks=json.loads(doctor(get_controller(), json=True)))
"""

# ----- GPUs: TensorFlow on the cards, NVML to see what it took ----------------------------------------
NVML = """\
from tfgpu_magic.gpus.inventory import read_inventory
from tfgpu_magic.selftest.measure import cards
"""

ROWS = "ROW = 1024 * 1024 // 4\n"
"""float32 elements in one MiB: `tf.zeros([n, ROW])` is n MiB; `t[0, 0].numpy()` waits for it."""

VISIBLE_GPUS = NVML + CONFIGURE + """\
for index in range(len(tf.config.list_logical_devices("GPU"))):
    with tf.device(f"/GPU:{index}"):
        (tf.constant(1) + 1).numpy()
report(tf_gpus=len(tf.config.list_physical_devices("GPU")), cards=cards(read_inventory()))
"""

GROWTH = NVML + """\
before = cards(read_inventory())
""" + CONFIGURE + ROWS + """\
with tf.device("/GPU:0"):
    tf.zeros([1, ROW])[0, 0].numpy()
report(before=before, after=cards(read_inventory()))
"""
"""Growth on or off: the card's free memory before, this process's share after a 1 MiB tensor."""

PAST_CAP = ROWS + """\
mib = ARGS["mib"]
try:
    with tf.device("/GPU:0"):
        tf.zeros([mib * 3 // 2, ROW])[0, 0].numpy()
    oom = False
except tf.errors.ResourceExhaustedError:
    oom = True
"""
"""1.5 times the cap (`ARGS["mib"]`) must not fit on (the first logical) GPU:0."""

LIMIT = NVML + CONFIGURE + PAST_CAP + """\
with tf.device("/GPU:0"):
    kept = tf.zeros([mib // 2, ROW])
    kept[0, 0].numpy()
report(oom=oom, cards=cards(read_inventory()))
"""
"""Past the limit fails; half of it fits, and NVML then shows the pool."""

SPLIT_GPU = CONFIGURE + PAST_CAP + """\
logical = len(tf.config.list_logical_devices("GPU"))
second = None
if logical > 1:
    with tf.device("/GPU:1"):
        tf.zeros([mib // 2, ROW])[0, 0].numpy()
    second = True
report(logical_gpus=logical, oom=oom, second_fits=second)
"""

ALLOCATOR = CONFIGURE + ROWS + """\
with tf.device("/GPU:0"):
    tf.zeros([16, ROW])[0, 0].numpy()
report(allocator=os.environ.get("TF_GPU_ALLOCATOR"))
"""
"""TensorFlow says which allocator it built on stderr (its policy includes `loglevel info`)."""

MEMORY_INFO = NVML + CONFIGURE + ROWS + """\
with tf.device("/GPU:0"):
    held = tf.zeros([ARGS["mib"], ROW])
    held[0, 0].numpy()
rows = tfgpu_magic.memory()
report(tensors_bytes=rows[0]["tensors_bytes"] if rows else None, cards=cards(read_inventory()))
"""
"""TensorFlow's count of its tensors (`tfgpu_magic.memory()`, from `get_memory_info`) against NVML."""


# ----- JAX and PyTorch: no TensorFlow in these ---------------------------------------------------------
JAX = POLICY_FIRST + """\
jax = __import__("jax")  # the policy's hook sets JAX's variables as this import finishes
bridge = __import__("jax._src.xla_bridge", fromlist=["xla_bridge"])
client = __import__("jaxlib.xla_client", fromlist=["xla_client"])
started_at_import = bridge.backends_are_initialized()
reader = getattr(client, "generate_pjrt_gpu_plugin_options", None)
given = []
if reader is not None:
    def _given():  # what JAX's CUDA plugin calls as the backends start (jax_plugins/cuda/__init__.py: initialize)
        options = reader()
        given.append(dict(options))
        return options
    client.generate_pjrt_gpu_plugin_options = _given
at_start = {}

def _at_start(backend):
    if at_start:
        return
    at_start["env"] = {name: os.environ.get(name) for name in ARGS["variables"]}
    try:
        at_start["options"] = None if reader is None else dict(reader())
    except ValueError as err:  # jaxlib refuses both names of the memory fraction
        at_start["error"] = str(err)

register = getattr(bridge, "register_backend_initialization_hook", None)
if register is not None:
    register(_at_start)
platforms = sorted({device.platform for device in jax.devices()})  # the backends start here
_at_start(None)  # a JAX without the hook: read as they just started
try:
    gpus = jax.devices("gpu")
except RuntimeError:  # "Unknown backend: 'gpu' requested": no GPU backend here
    gpus = []
cards = []
for device in gpus:
    jax.device_put(0.0, device).block_until_ready()
    stats = device.memory_stats() or {}
    cards.append({"device": str(device), "bytes_limit": stats.get("bytes_limit"),
                  "bytes_in_use": stats.get("bytes_in_use")})
report(version=jax.__version__, started_at_import=started_at_import, env=at_start["env"],
       options=at_start.get("options"), error=at_start.get("error"), given=given[0] if given else None,
       platforms=platforms, gpus=cards)
"""
"""`import jax` after the policy, then its backends start: what jaxlib's reader of the `XLA_*` variables
(`generate_pjrt_gpu_plugin_options`) makes of the environment at that moment, and what JAX's CUDA
plugin was given where there is one; on a GPU, each device's allocator limit after a first op."""

TORCH = '''\
at_load = {}

class _AtLoad:
    """Notes the environment as torch's C library loads (`import torch` imports torch._C): a CUDA build
    picks its allocator backend then (c10/cuda/CUDACachingAllocator.cpp: BackendStaticInitializer)."""
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch._C" and not at_load:
            at_load.update({name: os.environ.get(name) for name in ARGS["variables"]})
        return None

''' + POLICY_FIRST + """\
sys.meta_path.insert(0, _AtLoad())
torch = __import__("torch")  # the policy's hook sets the allocator configuration as this import begins
reader = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
settings = None if reader is None else reader()
from tfgpu_magic import get_controller
fractions = get_controller().fractions
queued = sum(getattr(call, "__self__", None) is fractions for call, _ in torch.cuda._queued_calls)
cuda_started = torch.cuda.is_initialized()
gpu = None
if torch.cuda.is_available():
    try:
        torch.zeros(1, device="cuda")  # a first CUDA call: torch runs its queued calls as CUDA starts
        count = torch.cuda.device_count()
        gpu = {"devices": count, "backend": torch.cuda.get_allocator_backend(),
               "fractions": {str(d): torch.cuda.get_per_process_memory_fraction(d) for d in range(count)}}
    except Exception as err:
        gpu = {"error": f"{type(err).__name__}: {err}"}
report(version=torch.__version__, cuda_build=torch.version.cuda, at_load=at_load or None, settings=settings,
       queued=queued, fractions={str(d): share for d, share in fractions.wanted().items()},
       cuda_started=cuda_started, gpu=gpu)
"""
"""`import torch` after the policy: the allocator configuration in the environment as torch's C library
loads, what torch's own reader parses (`_accelerator_getAllocatorSettings`, first called here), the
policy's call in torch's queue for CUDA's start and the per-device fractions it gives then; on a GPU,
after a first CUDA call, the fraction and the backend torch reports."""


def script(body: str) -> str:
    """The whole child script for a probe `body`."""
    return PRELUDE + body

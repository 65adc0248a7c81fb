"""OOMs that explain themselves and let go (`tfgpu_magic.tf.oom`), and who initialized TensorFlow
(`tfgpu_magic.tf.initcell`).

One real kernel runs real TensorFlow (CPU build): a real OOM (`tf.zeros([1 << 38])`, ~10 s), its
explanation after the untouched traceback, and the tensor only the failed frames held dead after the
cell (weakref); with the release turned off, a raised `ResourceExhaustedError` keeps it alive. The
GPU wording comes from the fakes (FakeTF, FakeNvml's four_gpus, FakeMemory), which decide the cards'
figures. The frame-release mechanics run on the real in-process IPython shell.
"""

from __future__ import annotations

import io
import re
import sys
import traceback
import weakref
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest
from fake_memory import FakeMemory
from fake_nvml import OTHER_PID, FakeNvml, four_gpus
from fake_tf import FakeTF
from kernels import CellResult, Kernel, running_kernel, tensorflow_stays_out_of_pytest  # noqa: F401 (autouse)

from tfgpu_magic.controller import Controller
from tfgpu_magic.gpus.inventory import InventoryCatalog, Nvml, read_inventory
from tfgpu_magic.tf import quietimport, initcell, oom
from tfgpu_magic.tf.oom import parse_oom
from tfgpu_magic.tf.runtime import RuntimeState
from tfgpu_magic.views import oom as oom_view
from tfgpu_magic.views.tfstate import OUTSIDE, init_text, state_text

GPU_OOM = ("OOM when allocating tensor with shape[8192,1024,1024] and type float on "
           "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")


@pytest.fixture(autouse=True)
def worded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's words, the views' (`views.hookup` gives them when it hooks up the controller); put back after."""
    monkeypatch.setattr(oom.settings, "words", oom_view.outcome_text)


def explained(*args, **kwargs) -> str:
    """`oom.explain`'s note in the views' words."""
    return "\n".join(oom_view.explanation(oom.explain(*args, **kwargs)))


# ----- parsing what was asked for -----------------------------------------------------------------
@pytest.mark.parametrize("message, shape, dtype, device, size", [
    (GPU_OOM, (8192, 1024, 1024), "float", "GPU:0", 32 << 30),
    ("{{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}} OOM when allocating "
     "tensor with shape[274877906944] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator "
     "mklcpu [Op:Fill] name: ", (274877906944,), "float", "CPU:0", 1 << 40),
    ("OOM when allocating tensor with shape[64,3,224,224] and type half on /device:GPU:1 by allocator GPU_1_bfc",
     (64, 3, 224, 224), "half", "GPU:1", 64 * 3 * 224 * 224 * 2),
    ("OOM when allocating tensor with shape[] and type int64 on /device:GPU:0", (), "int64", "GPU:0", 8),
    ("OOM when allocating tensor with shape[10] and type variant", (10,), "variant", None, None),
])
def test_the_request_is_parsed_into_bytes(message, shape, dtype, device, size) -> None:
    request = parse_oom(message)
    assert (request.shape, request.dtype, request.device, request.bytes) == (shape, dtype, device, size)


def test_a_message_without_a_tensor_is_no_request() -> None:
    assert parse_oom("Ran out of GPU memory when allocating 0 bytes for") is None


# ----- the explanation with GPU figures (fakes) ---------------------------------------------------
def gpu_session(*lines: str) -> tuple[FakeTF, Controller, FakeMemory]:
    """Four fake cards (FakeNvml decides the NVML figures: this process 1 GiB on GPU 0, pid 4242
    19 GiB), the policy `lines`, then TensorFlow imported and initialized (FakeTF decides what is
    recorded; FakeMemory the tensor bytes)."""
    inventory = read_inventory(Nvml(module=FakeNvml(four_gpus())))
    env: dict[str, str] = {}
    fake = FakeTF(4, imported=False, environ=env)
    ctl = Controller(api=fake, environ=env, catalog=InventoryCatalog(inventory))
    if lines:
        ctl.edit([ctl.parse(line) for line in lines])
    fake.imported = True
    quietimport.disarm()
    ctl.apply()
    fake.initialize()
    return fake, ctl, FakeMemory(fake)


def test_a_capped_gpu_oom_names_the_cap_and_what_to_do() -> None:
    fake, ctl, mem = gpu_session("visible 0,1", "limit 4GB 0")
    mem.allocate("GPU:0", 3 << 30)
    text = explained(Exception(GPU_OOM), ctl, mem)
    assert "tfgpu: TensorFlow ran out of memory on GPU:0: it asked for 32.0 GiB (shape [8192, 1024, 1024], float)." \
        in text
    assert "Cap in force: 4.0 GiB (limit on GPU 0, 5% of the card)" in text
    assert "this process holds 1.0 GiB of the card's 80.0 GiB" in text
    assert f"other processes: pid {OTHER_PID} 19.0 GiB" in text
    assert "Tensors now 3.0 GiB, peak so far (`%tfgpu watch on` resets it per cell) 3.0 GiB." in text
    assert "`%tfgpu limit off` (the cap is what ran out)" in text
    assert "`%tfgpu growth on`" in text and "`%tfgpu restart` to apply that and give TensorFlow's pool back" in text


def test_an_uncapped_gpu_oom_does_not_blame_a_cap() -> None:
    fake, ctl, mem = gpu_session("visible 1", "growth on")
    text = explained(Exception(GPU_OOM), ctl, mem, peak_from_cell=True)
    assert "Cap in force: none (growth on: the pool grows on demand)" in text
    assert "limit off" not in text and "growth on`" not in text
    assert "`%tfgpu restart` to give TensorFlow's pool back to the card" in text
    assert "the cell's peak" in text


def test_a_cpu_oom_says_host_memory() -> None:
    fake, ctl, mem = gpu_session()
    text = explained(Exception(parse_message_cpu()), ctl, mem)
    assert "on CPU:0: it asked for 1.0 TiB" in text and "host memory (RAM)" in text
    assert "Cap in force" not in text and text.endswith("Next: a smaller batch or tensor.")


def parse_message_cpu() -> str:
    return ("OOM when allocating tensor with shape[274877906944] and type float on "
            "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu")


# ----- releasing the failed frames, on the real in-process shell ----------------------------------
FAILING_CELL = """
import weakref
class Held: pass
def step():
    held = Held()
    global ref; ref = weakref.ref(held)
    raise MemoryError("no room")
step()
"""


@pytest.fixture
def ipshell():
    from IPython.testing import globalipapp

    return globalipapp.get_ipython()


def test_clear_frames_alone_keeps_the_tensor_but_the_release_frees_it(ipshell) -> None:
    """Why the release exists (docs/memory.md, "OOMs explain themselves"), on IPython's real traceback
    path: after `traceback.clear_frames` the object lives on (the formatter's `f_locals` snapshot holds
    it); `release_frames` frees it, and the traceback stays."""
    result = ipshell.run_cell(FAILING_CELL)
    error = result.error_in_exec
    traceback.clear_frames(sys.last_traceback)
    import gc

    gc.collect()
    assert ipshell.user_ns["ref"]() is not None
    step = [frame for frame in oom.frames_of(error) if frame.f_code.co_name == "step"][0]
    assert oom.release_frames(error) >= 2  # step, and IPython's run_code
    assert ipshell.user_ns["ref"]() is None
    assert step.f_locals == {}  # what `%debug` shows of that frame now
    assert sys.last_traceback is not None and "step" in "".join(traceback.format_tb(sys.last_traceback))


def test_the_cells_own_namespace_is_not_cleared(ipshell) -> None:
    result = ipshell.run_cell("kept = [1, 2, 3]\nraise MemoryError('x')")
    oom.release_frames(result.error_in_exec)
    assert ipshell.user_ns["kept"] == [1, 2, 3]


def raised_in_a_frame(error: BaseException) -> tuple[BaseException, Callable[[], object]]:
    """`error` as raised by a function whose frame alone holds an object; the error, and a weakref
    to that object (dead once that frame is cleared)."""
    refs: list[Callable[[], object]] = []

    class Held:
        pass

    def step() -> None:
        held = Held()
        refs.append(weakref.ref(held))
        raise error

    try:
        step()
    except BaseException as raised:  # noqa: BLE001 (any error: the one given)
        return raised, refs[0]
    raise AssertionError("step() did not raise")


def test_the_hook_ignores_other_errors_and_successes(tensorflow_errors: type[Exception]) -> None:
    """Armed (TensorFlow's `ResourceExhaustedError` exists), the hook prints nothing and clears no
    frame after a cell that succeeded or one that raised Python's own `MemoryError`, even worded as
    TensorFlow's OOM; the same hook explains and releases TensorFlow's OOM, so its silence is a choice."""
    out = io.StringIO()
    hook = oom.OomHook(Controller(environ={}), out=out)
    hook(SimpleNamespace(error_in_exec=None))
    other, held = raised_in_a_frame(MemoryError(GPU_OOM))
    hook(SimpleNamespace(error_in_exec=other))
    assert out.getvalue() == "" and held() is not None
    error, held = raised_in_a_frame(tensorflow_errors(parse_message_cpu()))
    hook(SimpleNamespace(error_in_exec=error))
    assert out.getvalue().startswith("tfgpu: TensorFlow ran out of memory on CPU:0: it asked for 1.0 TiB")
    assert held() is None and "released what only the failed cell's frames held" in out.getvalue()


def test_without_the_views_words_the_hook_releases_and_says_nothing(tensorflow_errors: type[Exception]) -> None:
    """The `tf` room finds and releases; only the views speak: before they fill `settings.words`
    (outside the magic, the panel and `configure()`), an OOM's frames are still released, silently."""
    oom.settings.words = None
    out = io.StringIO()
    error, held = raised_in_a_frame(tensorflow_errors(GPU_OOM))
    oom.OomHook(Controller(environ={}), out=out)(SimpleNamespace(error_in_exec=error))
    assert out.getvalue() == "" and held() is None


def test_an_explanation_that_fails_is_one_line_and_the_frames_are_still_released(
        tensorflow_errors: type[Exception]) -> None:
    """Reading the figures raised (here: a controller without a policy): one `tfgpu:` line names that
    error, then the release line; the hook raises nothing."""
    out = io.StringIO()
    error, held = raised_in_a_frame(tensorflow_errors(GPU_OOM))
    oom.OomHook(SimpleNamespace(), out=out)(SimpleNamespace(error_in_exec=error))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tfgpu: (no explanation: AttributeError: ") and len(lines) == 2
    assert lines[1].startswith("tfgpu: released what only the failed cell's frames held (") and held() is None


# ----- cuDNN / cuBLAS start-up failures, on the real in-process shell ------------------------------
DNN_FAILURES = [
    ("RuntimeError", "Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR"),
    ("UnknownError", "Failed to get convolution algorithm. This is probably because cuDNN failed to initialize, so "
                     "try looking to see if a warning log message was printed above. [Op:Conv2D]"),
    ("InternalError", "failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED"),
    ("InternalError", "Blas GEMM launch failed : a.shape=(32, 784), b.shape=(784, 10), m=32, n=10, k=784 [Op:MatMul]"),
]


@pytest.fixture
def hooked(ipshell) -> Iterator[object]:
    """The real shell with the OOM hook registered as TensorFlow's import would (no GPU, no TF)."""
    oom.uninstall(ipshell)
    oom.install(ipshell, Controller(environ={}))
    yield ipshell
    oom.uninstall(ipshell)


def tfgpu_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tfgpu:")]


@pytest.mark.parametrize("kind, message", DNN_FAILURES, ids=["cudnn-handle", "conv-algorithm", "cublas", "gemm"])
def test_a_dnn_startup_failure_points_to_who_and_growth(hooked, capsys, kind: str, message: str) -> None:
    """A cell raising TensorFlow's wording (any exception type: the cell defines its own class) gets
    IPython's traceback, then exactly one `tfgpu:` line; nothing is released."""
    capsys.readouterr()
    result = hooked.run_cell(f"class {kind}(Exception): pass\nraise {kind}({message!r})")
    assert type(result.error_in_exec).__name__ == kind
    captured = capsys.readouterr()
    assert tfgpu_lines(captured.err) == [oom_view.DNN_STARTUP_HINT]
    assert "`%tfgpu who`" in oom_view.DNN_STARTUP_HINT and "`%tfgpu growth on`" in oom_view.DNN_STARTUP_HINT
    assert message[:20] in captured.out + captured.err  # the traceback is IPython's own, untouched


def test_a_dnn_failure_as_the_cause_is_recognised(hooked, capsys) -> None:
    """Keras re-raises: the cuDNN message is on the cause, not on the error the cell ends with."""
    capsys.readouterr()
    hooked.run_cell("raise ValueError('training failed') from RuntimeError('CUDNN_STATUS_INTERNAL_ERROR')")
    assert tfgpu_lines(capsys.readouterr().err) == [oom_view.DNN_STARTUP_HINT]


@pytest.mark.parametrize("cell", ["raise ValueError('cudnn is fine, the input is not')", "x = 1",
                                  "raise KeyError('CUBLAS')"])
def test_other_cells_get_no_hint(hooked, capsys, cell: str) -> None:
    capsys.readouterr()
    hooked.run_cell(cell)
    assert tfgpu_lines(capsys.readouterr().err) == []


# ----- errors the hook does not understand pass untouched -------------------------------------------
UNREADABLE = {
    "message-raises": "class Unreadable(Exception):\n    @property\n    def message(self):\n        raise RuntimeError('no')\n",
    "str-raises": "class Unreadable(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n",
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_error_whose_text_cannot_be_read_gets_nothing_from_the_hook(hooked, capsys, case: str) -> None:
    """Its `message` property or its `__str__` raises: no "Error in callback", no traceback from
    oom.py, no `tfgpu:` line; and the hook itself, called as any shell calls it, does not raise."""
    capsys.readouterr()
    result = hooked.run_cell(UNREADABLE[case] + "raise Unreadable()")
    assert type(result.error_in_exec).__name__ == "Unreadable"
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert "Error in callback" not in shown and "oom.py" not in shown and tfgpu_lines(shown) == []
    assert oom.OomHook(Controller(environ={}))(result) is None


class ResourceExhaustedError(Exception):
    """Stands for TensorFlow's class of that name (TensorFlow stays out of this process)."""


@pytest.fixture
def tensorflow_errors(monkeypatch: pytest.MonkeyPatch) -> type[Exception]:
    """`oom_types()` finds `ResourceExhaustedError` above, as it would find TensorFlow's once imported."""
    monkeypatch.setitem(sys.modules, "tensorflow",
                        SimpleNamespace(errors=SimpleNamespace(ResourceExhaustedError=ResourceExhaustedError)))
    return ResourceExhaustedError


HOLDING_CELL = """
import weakref
class Held: pass
def step():
    held = Held()
    global ref; ref = weakref.ref(held)
    raise ResourceExhaustedError(MESSAGE)
step()
"""


@pytest.mark.parametrize(("message", "memory"), [
    ("Quota exceeded for GCS bucket my-bucket", False),
    ("Rate limit exceeded: 429 Too Many Requests", False),
    ("OOM when allocating tensor with shape[10] and type float on /device:CPU:0 by allocator cpu", True),
    ("Out of memory while trying to allocate 17179869184 bytes.", True),
], ids=["quota", "rate-limit", "oom", "xla-oom"])
def test_only_memory_exhaustion_is_explained_and_released(hooked, capsys, tensorflow_errors, message: str,
                                                           memory: bool) -> None:
    """`ResourceExhaustedError` also reports quotas and rate limits: those keep their frames (the held
    object lives) and get no `tfgpu:` line; running out of memory gets both."""
    capsys.readouterr()
    hooked.user_ns.update(ResourceExhaustedError=tensorflow_errors, MESSAGE=message)
    hooked.run_cell(HOLDING_CELL)
    lines = tfgpu_lines(capsys.readouterr().err)
    if memory:
        assert lines[0].startswith("tfgpu: TensorFlow ran out of memory") and "released" in lines[-1]
        assert hooked.user_ns["ref"]() is None
    else:
        assert lines == [] and hooked.user_ns["ref"]() is not None


# ----- who initialized, through a fake state ------------------------------------------------------
class FakeEvents:
    def __init__(self) -> None:
        self.callbacks = {"pre_run_cell": [], "post_run_cell": []}

    def register(self, event: str, callback) -> None:
        self.callbacks[event].append(callback)

    def unregister(self, event: str, callback) -> None:
        self.callbacks[event].remove(callback)


@pytest.fixture
def fresh_record() -> Iterator[None]:
    initcell.forget()
    yield
    initcell.forget()


def test_the_initializing_cell_is_named_and_the_hooks_leave(fresh_record) -> None:
    state = {"initialized": False}
    shell = SimpleNamespace(events=FakeEvents(), history_manager=SimpleNamespace(input_hist_parsed=["", "a"]))
    watch = initcell.watch_initialization(shell, lambda: state["initialized"])
    assert watch is not None and len(shell.events.callbacks["post_run_cell"]) == 1
    watch.post(SimpleNamespace(execution_count=2, info=SimpleNamespace(raw_cell="x = 1\n")))
    assert initcell.initialized_record() is None
    watch.pre()
    state["initialized"] = True
    cell = "\n  model.fit(x_train, y_train, epochs=10, batch_size=128)\nmore\n"
    watch.post(SimpleNamespace(execution_count=7, info=SimpleNamespace(raw_cell=cell)))
    assert init_text(initcell.initialized_record()) == "by In [7]: `model.fit(x_train, y_train, ...`"
    assert shell.events.callbacks == {"pre_run_cell": [], "post_run_cell": []}
    assert state_text(RuntimeState(imported=True, initialized=True), initcell.initialized_record()) == (
        "initialized by In [7]: `model.fit(x_train, y_train, ...`: device settings are locked until restart")


def test_initialized_outside_a_cell_says_what_is_known(fresh_record) -> None:
    shell = SimpleNamespace(events=FakeEvents(), history_manager=SimpleNamespace(input_hist_parsed=["", "a", "b"]))
    state = {"initialized": False}
    watch = initcell.watch_initialization(shell, lambda: state["initialized"])
    state["initialized"] = True  # e.g. a startup file, or a variable inspector's silent request
    watch.pre()
    assert init_text(initcell.initialized_record()) == OUTSIDE + ", before In [3]"
    assert shell.events.callbacks == {"pre_run_cell": [], "post_run_cell": []}


def test_no_shell_or_already_initialized_registers_nothing(fresh_record) -> None:
    assert initcell.watch_initialization(None) is None
    shell = SimpleNamespace(events=FakeEvents())
    assert initcell.watch_initialization(shell, lambda: True) is None
    assert shell.events.callbacks == {"pre_run_cell": [], "post_run_cell": []}
    assert init_text(initcell.initialized_record()).startswith("before tfgpu_magic could watch")


# ----- the whole story in one real kernel (real TensorFlow, CPU build) ----------------------------
OURS = ("[c for e in ('pre_run_cell', 'post_run_cell') for c in get_ipython().events.callbacks[e] "
        "if 'tfgpu_magic' in getattr(c, '__module__', '') + type(c).__module__]")
"""Our callbacks on the kernel's cell events."""
SETUP = """
import tensorflow as tf
from tfgpu_magic import get_controller
from tfgpu_magic.tf import cellhooks, initcell, oom
cellhooks.on_tensorflow_import(get_controller())  # what the import hook's callback does (hook-up)
"""
REAL_OOM = """
import weakref
def step():
    held = tf.ones([256, 1024])
    global ref; ref = weakref.ref(held)
    tf.zeros([1 << 38])
step()
"""
RAISED_OOM = f"""
def step2():
    held = tf.ones([256, 1024])
    global ref2; ref2 = weakref.ref(held)
    raise tf.errors.ResourceExhaustedError(None, None, {GPU_OOM!r})
step2()
"""


@pytest.fixture(scope="module")
def tf_kernel() -> Iterator[Kernel]:
    with running_kernel() as kernel:
        kernel.ok("%load_ext tfgpu_magic")
        assert kernel.evaluate(f"len({OURS})") == 0  # before TensorFlow is imported: no hook at all
        kernel.ok(SETUP)
        # the initializing-cell pair, the OOM hook, the publisher's cell marks and look after each cell (a
        # kernel of a server's: `kernelstate.Publisher.before_cell`/`after_cell`), and the record of each
        # cell's memory (`cellmemory.CellRecorder`: it goes once the runtime lists no GPU)
        assert kernel.evaluate(f"len({OURS})") == 7
        yield kernel


@pytest.mark.tensorflow
def test_a_real_oom_explains_itself_and_lets_go(tf_kernel: Kernel) -> None:
    """The traceback is IPython's own (ename, the failing frame), the explanation follows it on
    stderr, and the tensor only `step`'s frame held is dead by the next cell; `%tb` still works."""
    assert tf_kernel.evaluate("initcell.initialized_record()") is None  # imported, not initialized yet
    tf_kernel.ok("x = tf.constant(1)  # the first op")
    assert tf_kernel.evaluate("tuple(initcell.initialized_record())") == ("cell", 3, "x = tf.constant(1)  # the first op")
    # the pair left once the cell was known: the OOM hook and the publisher's cell marks and look remain
    assert tf_kernel.evaluate(f"len({OURS})") == 3
    result = tf_kernel.run(REAL_OOM, timeout=180)
    assert result.status == "error" and result.errors[0]["ename"] == "ResourceExhaustedError"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", result.traceback)  # IPython's colours
    assert "step()" in shown and "tf.zeros([1 << 38])" in shown
    assert "tfgpu: TensorFlow ran out of memory on CPU:0: it asked for 1.0 TiB (shape [274877906944], float)." \
        in result.stderr
    assert "host memory (RAM)" in result.stderr
    assert "`%debug` on this error sees cleared frames" in result.stderr
    assert tf_kernel.evaluate("ref() is None") is True
    assert "tf.zeros([1 << 38])" in re.sub(r"\x1b\[[0-9;]*m", "", tf_kernel.run("%tb").output)


@pytest.mark.tensorflow
def test_with_the_release_off_the_frames_keep_the_tensor(tf_kernel: Kernel) -> None:
    """Also: the notebook gets the error (the traceback) first, then the explanation."""
    tf_kernel.ok("oom.settings.release = False")
    result, order = CellResult(), []

    def hook(msg: dict) -> None:
        result.collect(msg)
        content = msg["content"]
        if msg["msg_type"] == "error" or "tfgpu:" in content.get("text", ""):
            order.append(msg["msg_type"])

    tf_kernel.client.execute_interactive(RAISED_OOM, timeout=60, output_hook=hook, allow_stdin=False)
    assert result.errors[0]["ename"] == "ResourceExhaustedError" and order[0] == "error" and "stream" in order
    assert "on GPU:0: it asked for 32.0 GiB" in result.stderr and "released" not in result.stderr
    assert tf_kernel.evaluate("ref2() is not None") is True
    tf_kernel.ok("oom.settings.release = True")


@pytest.mark.tensorflow
def test_a_real_quota_error_keeps_its_frames_and_gets_no_explanation(tf_kernel: Kernel) -> None:
    """TensorFlow's own `ResourceExhaustedError` for a storage quota is no OOM: untouched."""
    result = tf_kernel.run("import weakref\ndef step3():\n    held = tf.ones([256, 1024])\n    global ref3; ref3 = weakref.ref(held)\n"
                           "    raise tf.errors.ResourceExhaustedError(None, None, 'Quota exceeded for GCS bucket')\n"
                           "step3()")
    assert result.status == "error" and result.errors[0]["ename"] == "ResourceExhaustedError"
    assert tfgpu_lines(result.stderr) == [] and tf_kernel.evaluate("ref3() is not None") is True


@pytest.mark.tensorflow
def test_a_real_tensorflow_dnn_error_gets_the_hint(tf_kernel: Kernel) -> None:
    """TensorFlow's own UnknownError with cuDNN's wording, raised in a kernel cell (CPU build: raised
    by hand), gets the one hint line from the hook TensorFlow's import installed."""
    message = DNN_FAILURES[1][1]
    result = tf_kernel.run(f"raise tf.errors.UnknownError(None, None, {message!r})")
    assert result.status == "error" and result.errors[0]["ename"] == "UnknownError"
    assert tfgpu_lines(result.stderr) == [oom_view.DNN_STARTUP_HINT]

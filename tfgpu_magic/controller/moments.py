"""Where the frameworks are in their lives, and the hooks that catch their moments: TensorFlow's import
(its cell hooks and device-creating routes, once), JAX's and PyTorch's imports (the policy applied as
each finishes, PyTorch's variables set before its CUDA library loads), and what the plan needs to know
of them (`plan.Frameworks`).

JAX, PyTorch and Keras tell nobody where they are: each is read from `sys.modules` (`frameworks`),
never imported here.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator, Mapping

from .. import importhooks
from ..frameworks import jax, keras
from ..frameworks import torch as torch_room
from ..frameworks.torch import TorchAPI
from ..gpus.inventory import Inventory
from ..plan import ALL_FRAMEWORKS, Frameworks
from ..tf import quietimport
from ..tf.apply import ConfigAPI

JAX, TORCH = "jax", "torch"
"""The top-level packages whose import the controller watches (`importhooks`)."""


class FrameworkMoments:
    """The frameworks of one process as the controller follows them: TensorFlow through its seam (`api`),
    PyTorch through its (`torch`), JAX and Keras from `sys.modules`; the one-time work at TensorFlow's
    import, and PyTorch's import while its variables are being set."""

    __slots__ = ("api", "torch", "_tf_ready", "torch_importing")

    def __init__(self, api: ConfigAPI, torch: TorchAPI) -> None:
        self.api = api
        self.torch = torch
        self._tf_ready = False
        self.torch_importing = False
        """PyTorch's import is under way (`sys.modules` has the half-made module): the plan counts it."""

    def moment(self) -> tuple[object, ...]:
        """Where JAX, PyTorch and Keras are in their lives (imported; backends or CUDA started), which
        they tell nobody: a few attribute reads, cheap enough for after every cell."""
        return jax.state(), self.torch.state(), keras.imported()

    def frameworks(self, limited: bool, growth_left: bool, inventory: Callable[[], Inventory],
                   environ: Mapping[str, str], alloc_conf: str | None, every: bool = False,
                   imports: bool = False) -> Frameworks:
        """What the plan needs to know of the other frameworks here: those imported (one imported later
        gets the policy as its import finishes: `watch_imports`), or every one (`every`: for a fresh
        process elsewhere); with `imports`, also those installed and not imported, whose import the plan
        works out apart (`plan.AtImport`: what the status shows). The cards' totals and JAX's fraction
        variable are read only where the policy has a limit (`limited`), Keras's backend only where the
        policy leaves growth to it (`growth_left`)."""
        torch_state, jax_state = self.torch.state(), jax.state()
        here = ALL_FRAMEWORKS if every else Frameworks(
            jax=jax_state.imported, torch=torch_state.imported or self.torch_importing,
            tensorflow=self.api.state().imported, cuda_users=torch_state.cuda_started or jax_state.started)
        if imports and not every:
            here = here._replace(jax_at_import=not jax_state.imported and jax.installed(),
                                 torch_at_import=not torch_state.imported and torch_room.installed())
        jax_planned = here.jax or here.jax_at_import
        cards = inventory() if limited and (jax_planned or here.torch or here.torch_at_import) else None
        totals = {gpu.ref: gpu.memory_total_mib for gpu in cards.gpus if gpu.memory_total_mib} \
            if cards is not None and cards.available else {}
        fraction_variable = jax.fraction_variable(environ) if limited and jax_planned else here.fraction_variable
        return here._replace(fraction_variable=fraction_variable, alloc_conf=alloc_conf, totals=totals,
                             keras_backend=keras.state(environ).backend if growth_left else None)

    def tensorflow_imported(self, ready: Callable[[], None]) -> None:
        """Once TensorFlow is imported, whoever imported it first (this extension's hook, or the user
        before loading it): `ready` (its cell hooks and the device-creating routes), once."""
        if self._tf_ready:
            return
        self._tf_ready = True
        quietimport.disarm()
        ready()

    @staticmethod
    def quiet_tensorflow(loglevel: str | None) -> None:
        """Before TensorFlow's import: how quiet its import must be (`tf.quietimport`)."""
        quietimport.quiet(loglevel)

    @staticmethod
    def arm_tensorflow(callback: Callable[[], None]) -> None:
        """Before TensorFlow's import: `callback` right after it (once armed, armed)."""
        if not quietimport.is_armed():
            quietimport.arm(callback)

    def watch_imports(self, told: Mapping[str, bool], callback: Callable[[], None],
                      prepare_torch: Callable[[], None]) -> None:
        """Where the policy tells JAX or PyTorch something (`told`, by top-level package) and one is
        installed but not imported, a hook runs `callback` as its import finishes (before its backends or
        CUDA can start); PyTorch's import runs `prepare_torch` first (its variables, read as its CUDA
        library loads)."""
        installed = {JAX: lambda: not jax.state().imported and jax.installed(),
                     TORCH: lambda: not self.torch.state().imported and torch_room.installed()}
        around: dict[str, Callable[[], ContextManager[None]]] = {
            JAX: contextlib.nullcontext, TORCH: lambda: self._torch_import(prepare_torch)}
        for name, wanted in told.items():
            if wanted and not importhooks.is_armed(name) and installed[name]():
                importhooks.arm(name, callback, around[name])

    @contextlib.contextmanager
    def _torch_import(self, prepare: Callable[[], None]) -> Iterator[None]:
        """`import torch` with PyTorch's variables set first (`prepare`): its CUDA library picks the
        allocator backend as it loads (`envvars.PYTORCH_CUDA_ALLOC_CONF`)."""
        self.torch_importing = True
        try:
            prepare()
            yield
        finally:
            self.torch_importing = False

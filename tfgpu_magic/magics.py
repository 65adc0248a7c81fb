"""The `%tfgpu` / `%%tfgpu` magic: a thin view over the controller."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import List, Unicode

from .controller import Controller, get_controller
from .errors import PolicyError
from .export import export
from .grammar import Action, parse_cell, parse_words
from .status import RESTART_HINT, describe_report, describe_status


@magics_class
class TFGPUMagics(Magics):
    """Magics that record and apply the TensorFlow GPU policy."""

    default_policy = List(
        Unicode(),
        help="Directives applied when the extension loads, e.g. ['growth on', 'visible 0'].",
    ).tag(config=True)

    def __init__(self, shell, controller: Controller | None = None) -> None:  # noqa: ANN001
        super().__init__(shell=shell)
        self.controller = controller or get_controller()

    @magic_arguments()
    @argument(
        "directive",
        nargs="*",
        help="growth all|on|off; limit SIZE|off [GPUS]; visible GPUS|all|none; "
        "split GPU COUNTxSIZE | GPU SIZE,SIZE,... | cpu COUNT | off [GPU|cpu]; allocator bfc|async; "
        "reset; apply; export [python|env|json]; restart. Nothing: show the status.",
    )
    @line_cell_magic
    def tfgpu(self, line: str, cell: str | None = None) -> None:
        """Control TensorFlow's GPUs from a notebook, before and after `import tensorflow`.

        Directives (one per line in a %%tfgpu cell, all or nothing)::

          %tfgpu                           status: TF state, policy, what TF recorded, devices
          %tfgpu growth all | on | off     memory growth on every visible GPU
          %tfgpu limit SIZE [GPUS]         hard memory cap on each listed GPU (default: every GPU)
          %tfgpu limit off [GPUS]
          %tfgpu visible GPUS | all | none which GPUs this kernel may use
          %tfgpu split GPU COUNTxSIZE      virtual GPUs on one GPU, e.g. split 0 2x2GB
          %tfgpu split GPU SIZE,SIZE,...   e.g. split 0 1GB,3GB
          %tfgpu split cpu COUNT           COUNT logical CPU devices
          %tfgpu split off [GPU | cpu]
          %tfgpu allocator bfc | async     TF_GPU_ALLOCATOR (async = cuda_malloc_async)
          %tfgpu reset                     forget the policy and the variables this tool set
          %tfgpu apply                     apply now if TensorFlow allows it (normally automatic)
          %tfgpu export [python|env|json]  the equivalent standalone code
          %tfgpu restart                   how to restart the kernel with the policy

        SIZE: MiB (4096) or 512MB, 1.5GB, 2GiB, 3G (binary units, like TF and nvidia-smi).
        GPUS: indices in nvidia-smi order (0,2 or 0-3), GPU UUIDs or unique UUID prefixes.
        Growth together with a limit or split is realised through TF_FORCE_GPU_ALLOW_GROWTH=true
        (TensorFlow refuses set_memory_growth on a GPU with logical devices).
        """
        try:
            if cell is not None:
                if line.strip():
                    raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
                self._show(self.controller.edit(parse_cell(cell, self.controller.catalog)))
                return
            words = parse_argstring(self.tfgpu, line).directive
            directive = parse_words(words, self.controller.catalog)
            if isinstance(directive, Action):
                self._act(directive)
            else:
                self._show(self.controller.edit([directive]))
        except PolicyError as err:
            raise UsageError(str(err)) from None

    def _act(self, action: Action) -> None:
        if action.name == "status":
            print(describe_status(self.controller))
        elif action.name == "apply":
            self._show(self.controller.apply())
        elif action.name == "export":
            print(export(self.controller.policy, action.arg or "python").rstrip("\n"))
        elif action.name == "restart":
            print("This version cannot restart the kernel for you yet. " + RESTART_HINT)

    @staticmethod
    def _show(report) -> None:  # noqa: ANN001
        print(describe_report(report))


def load(shell) -> TFGPUMagics:  # noqa: ANN001
    """Register the magics on `shell` and apply the configured default policy."""
    magics = TFGPUMagics(shell)
    shell.register_magics(magics)
    if magics.default_policy:
        controller = magics.controller
        try:
            report = controller.edit([controller.parse(line) for line in magics.default_policy])
        except PolicyError as err:
            print(f"tfgpu_magic: ignoring the configured default_policy: {err}")
        else:
            if not report.ok:
                print(describe_report(report))
    return magics

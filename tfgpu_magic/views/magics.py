"""The `%tfgpu` / `%%tfgpu` magic: IPython glue over the controller.

Kept light, since `%load_ext` imports it: what each directive does lives in `commands`, imported on
the first `%tfgpu`; the controller is created when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from traitlets import List, Unicode

from ..errors import PolicyError

if TYPE_CHECKING:
    from ..controller import Controller


@magics_class
class TFGPUMagics(Magics):
    """Magics that record and apply the TensorFlow GPU policy."""

    default_policy = List(
        Unicode(),
        help="Directives applied when the extension loads, e.g. ['growth on', 'visible 0'].",
    ).tag(config=True)

    def __init__(self, shell: Any, controller: Controller | None = None) -> None:
        super().__init__(shell=shell)
        self._controller = controller

    @property
    def controller(self) -> Controller:
        """The process-wide controller (or the one given), created on first use."""
        if self._controller is None:
            from ..controller import get_controller

            self._controller = get_controller()
        return self._controller

    @property
    def profile_dir(self) -> str:
        return self.shell.profile_dir.location

    @line_cell_magic
    @no_var_expand  # no directive needs `$var`, and expanding a long line costs quadratic time
    def tfgpu(self, line: str, cell: str | None = None) -> None:
        """Control TensorFlow's GPUs from a notebook, before and after `import tensorflow`.

        Directives (one per line in a %%tfgpu cell, all or nothing)::

          %tfgpu                           status: TF state, policy, what TF recorded, devices
          %tfgpu growth on | off | all     memory growth on every visible GPU (all is the same as on)
          %tfgpu limit SIZE [GPUS]         hard memory cap on each listed GPU (default: every visible GPU)
          %tfgpu limit off [GPUS]
          %tfgpu visible GPUS | all | none which GPUs this kernel may use
          %tfgpu visible auto[:N]          the N GPUs with the most free memory (pinned by UUID)
          %tfgpu split GPU COUNTxSIZE      virtual GPUs on one GPU, e.g. split 0 2x2GB
          %tfgpu split GPU SIZE,SIZE,...   e.g. split 0 1GB,3GB
          %tfgpu split cpu COUNT           COUNT logical CPU devices
          %tfgpu split off [GPU | cpu]
          %tfgpu allocator bfc | async     TF_GPU_ALLOCATOR (async = cuda_malloc_async)
          %tfgpu reset                     forget the policy and the variables this tool set
          %tfgpu apply                     apply now if TensorFlow allows it (normally automatic)
          %tfgpu export [python|env|json]  the equivalent standalone code
          %tfgpu restart [--yes]           restart the kernel with the policy in force
          %tfgpu doctor                    why TensorFlow does (not) see a GPU, with fixes
          %tfgpu panel                     the same policy as clickable widgets
          %tfgpu default save|clear|show   the policy every kernel starts with
          %tfgpu autoload on | off         load this extension in every new kernel of the profile
          %tfgpu kernelspec NAME [--display-name TEXT] [--remove]
                                           a Jupyter kernel that starts with this policy

        SIZE: MiB (4096) or 512MB, 1.5GB, 2GiB, 3G (binary units, like TF and nvidia-smi), or NN%
        of the card's memory (needs the NVML inventory).
        GPUS: indices in nvidia-smi order (0,2 or 0-3), GPU UUIDs or unique UUID prefixes.
        A word that starts with # begins a comment; $name and {expr} are not expanded.
        A %%tfgpu cell is checked as a whole: its lines may come in any order.
        Growth together with a limit or split is realised through TF_FORCE_GPU_ALLOW_GROWTH=true
        (TensorFlow refuses set_memory_growth on a GPU with logical devices).

        Options::

          --yes                  with restart: restart now, without asking
          --display-name TEXT    with kernelspec: the name shown in the launcher
          --remove               with kernelspec: uninstall it
        """
        # Lines reach the directives as typed: `$name` and `{expr}` are not expanded (`no_var_expand`).
        # The help above is written out rather than built by `magic_arguments`, whose argparse
        # import cost `%load_ext` a third of its time; `commands.OPTIONS` is what the parser uses.
        from .commands import run_cell, run_line

        try:
            if cell is not None:
                run_cell(self, line, cell)
            else:
                run_line(self, line)
        except PolicyError as err:
            raise UsageError(str(err)) from None


def load(shell: Any) -> TFGPUMagics:
    """Register the magics on `shell` and apply the policy this kernel starts with."""
    from ..jupyter.startup import say, startup_policy

    from .completion import register_completer

    magics = TFGPUMagics(shell)
    shell.register_magics(magics)
    register_completer(shell, lambda: magics.controller)
    policy, warnings = startup_policy(lambda: magics.controller, magics.default_policy, magics.profile_dir, shell)
    for warning in warnings:
        say(shell, f"tfgpu_magic: {warning}", warning=True)
    if policy is not None:
        report = magics.controller.set_policy(policy)
        if not report.ok:
            from .status import describe_report, restart_hint

            say(shell, describe_report(report, restart_hint(shell)))
    return magics

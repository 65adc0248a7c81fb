"""The `%tfgpu` / `%%tfgpu` magic: a thin view over the controller."""

from __future__ import annotations

import os
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import List, Unicode

from . import persist
from .controller import Controller, get_controller
from .errors import PolicyError, warn
from .export import export
from .grammar import Action, parse_cell, parse_words, split_words
from .policy import Policy
from .status import describe_policy, describe_report, describe_status, pending_groups

OPTIONS = {"--yes": ("restart", False), "--display-name": ("kernelspec", True), "--remove": ("kernelspec", False)}
"""Each option: the directive it belongs to, and whether it takes a value."""


@magics_class
class TFGPUMagics(Magics):
    """Magics that record and apply the TensorFlow GPU policy."""

    default_policy = List(
        Unicode(),
        help="Directives applied when the extension loads, e.g. ['growth on', 'visible 0'].",
    ).tag(config=True)

    def __init__(self, shell: Any, controller: Controller | None = None) -> None:
        super().__init__(shell=shell)
        self.controller = controller or get_controller()

    @magic_arguments()
    @argument(
        "directive",
        nargs="*",
        help="growth all|on|off; limit SIZE|off [GPUS]; visible GPUS|all|none; "
        "split GPU COUNTxSIZE | GPU SIZE,SIZE,... | cpu COUNT | off [GPU|cpu]; allocator bfc|async; "
        "reset; apply; export [python|env|json]; restart; doctor; panel; default save|clear|show; autoload on|off; "
        "kernelspec NAME. Nothing: show the status.",
    )
    @argument("--yes", action="store_true", help="with restart: restart now, without asking")
    @argument("--display-name", metavar="TEXT", help="with kernelspec: the name shown in the launcher")
    @argument("--remove", action="store_true", help="with kernelspec: uninstall it")
    @line_cell_magic
    def tfgpu(self, line: str, cell: str | None = None) -> None:
        """Control TensorFlow's GPUs from a notebook, before and after `import tensorflow`.

        Directives (one per line in a %%tfgpu cell, all or nothing)::

          %tfgpu                           status: TF state, policy, what TF recorded, devices
          %tfgpu growth all | on | off     memory growth on every visible GPU
          %tfgpu limit SIZE [GPUS]         hard memory cap on each listed GPU (default: every GPU)
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
        Growth together with a limit or split is realised through TF_FORCE_GPU_ALLOW_GROWTH=true
        (TensorFlow refuses set_memory_growth on a GPU with logical devices).
        """
        try:
            if cell is not None:
                if line.strip():
                    raise PolicyError("%%tfgpu takes its directives in the cell body, not on the first line")
                print(describe_report(self.controller.edit(parse_cell(cell, self.controller.catalog))))
                return
            words, options = split_options(line)
            directive = parse_words(words, self.controller.catalog)
            _check_options(options, directive)
            if isinstance(directive, Action):
                self._act(directive, options)
            else:
                print(describe_report(self.controller.edit([directive])))
        except PolicyError as err:
            raise UsageError(str(err)) from None

    def _act(self, action: Action, options: dict[str, Any]) -> None:
        handlers: dict[str, Callable[[], str]] = {
            "status": lambda: describe_status(self.controller),
            "apply": lambda: describe_report(self.controller.apply()),
            "export": lambda: export(self.controller.policy, action.arg or "python").rstrip("\n"),
            "restart": lambda: self._restart(bool(options.get("--yes"))),
            "doctor": lambda: _doctor(self.controller),
            "panel": self._panel,
            "default": lambda: self._default(action.arg or "show"),
            "autoload": lambda: persist.set_autoload(self._profile_dir(), action.arg == "on"),
            "kernelspec": lambda: self._kernelspec(
                action.arg or "", options.get("--display-name"), bool(options.get("--remove"))
            ),
        }
        text = handlers[action.name]()
        if text:
            print(text)

    def _restart(self, confirmed: bool) -> str:
        from .restart import restart_and_apply

        if confirmed or getattr(self.shell, "kernel", None) is None:
            return restart_and_apply(self.shell, self.controller.policy)
        pending = [f"  - {item}" for _, items in pending_groups(self.controller) for item in items]
        summary = "\n".join(
            ["Restarting loses every variable of this kernel." + (" Changes it applies:" if pending else "")]
            + pending
            + ["Click the button, or run `%tfgpu restart --yes`."]
        )
        from .confirm import show_restart_button

        print(summary)
        show_restart_button(lambda: restart_and_apply(self.shell, self.controller.policy))
        return ""

    def _panel(self) -> str:
        if getattr(self.shell, "kernel", None) is None:
            return "The panel needs a notebook front end (JupyterLab, Notebook 7, VS Code); here use %tfgpu directives."
        from .panel import show_panel
        from .restart import restart_and_apply

        show_panel(self.controller, self.shell, lambda: restart_and_apply(self.shell, self.controller.policy))
        return ""

    def _profile_dir(self) -> str:
        return self.shell.profile_dir.location

    def _default(self, verb: str) -> str:
        path = persist.default_path(self._profile_dir())
        if verb == "save":
            persist.write_policy(path, self.controller.policy)
            return f"Saved as the default policy of every kernel that loads tfgpu_magic ({path})."
        if verb == "clear":
            path.unlink(missing_ok=True)
            return f"No default policy any more ({path} removed)."
        found = persist.read_policy(path)
        if found is None:
            return f"No default policy saved ({path})."
        return f"Default policy ({path}): " + ("; ".join(describe_policy(found[0])) or "TensorFlow defaults")

    def _kernelspec(self, name: str, display_name: str | None, remove: bool) -> str:
        from . import kernelspec

        if remove:
            return f"Removed kernelspec {name!r} ({kernelspec.remove(name)})."
        where = kernelspec.install(name, self.controller.policy, display_name)
        return f"Installed kernelspec {name!r} in {where}; pick it in the launcher for a kernel with this policy."


def _doctor(controller: Controller) -> str:
    from .doctor import doctor

    return doctor(controller)


def split_options(line: str) -> tuple[list[str], dict[str, Any]]:
    """Words of the directive, and its `--options` (the `@argument` declarations above are the help).

    Parsed here rather than by argparse so that `-1GB` reaches the grammar (and gets its message),
    quotes and `#` comments behave as in a `%%tfgpu` cell, and every mistake is a `PolicyError`."""
    words, options = [], {}
    remaining = iter(split_words(line))
    for word in remaining:
        if not word.startswith("--"):
            words.append(word)
            continue
        name, has_value, value = word.partition("=")
        if name not in OPTIONS:
            raise PolicyError(f"unknown option {name}; the options are {', '.join(OPTIONS)} (see %tfgpu?)")
        if OPTIONS[name][1]:
            value = value if has_value else next(remaining, "")
            if not value:
                raise PolicyError(f"{name} needs a value, e.g. {name} \"TensorFlow GPU 0\"")
            options[name] = value
        elif has_value:
            raise PolicyError(f"{name} takes no value")
        else:
            options[name] = True
    return words, options


def _check_options(options: dict[str, Any], directive: Any) -> None:
    """Options belong to one directive each: `--yes` to restart, the others to kernelspec."""
    name = directive.name if isinstance(directive, Action) else directive.text.split()[0]
    for option in options:
        owner = OPTIONS[option][0]
        if name != owner:
            raise PolicyError(f"{option} only goes with `{owner}`")


def startup_policy(magics: TFGPUMagics) -> tuple[Policy | None, list[str]]:
    """The policy this kernel starts with, and warnings: later sources replace earlier ones —
    `default_policy` config, the saved default, a kernelspec's environment, a pending restart."""
    from .kernelspec import policy_from_env
    from .restart import current_kernel

    controller = magics.controller
    policy: Policy | None = None
    warnings: list[str] = []

    def attempt(source: str, read: Callable[[], Policy | None]) -> None:
        nonlocal policy
        try:
            found = read()
        except (PolicyError, OSError) as err:
            warnings.append(f"ignoring the {source}: {err}")
            return
        if found is not None:
            policy = found

    if magics.default_policy:
        attempt("configured default_policy", lambda: controller.edit_policy(magics.default_policy, Policy()))
    attempt("saved default", lambda: _first(persist.read_policy(persist.default_path(magics._profile_dir()))))
    attempt("policy of this kernelspec", lambda: policy_from_env(dict(os.environ)))
    kernel = current_kernel(magics.shell)
    if kernel is not None:
        attempt("pending policy", lambda: persist.take_pending(kernel.kernel_id))
    return policy, warnings


def _first(found: tuple[Policy, dict] | None) -> Policy | None:
    return None if found is None else found[0]


def load(shell: Any) -> TFGPUMagics:
    """Register the magics on `shell` and apply the policy this kernel starts with."""
    magics = TFGPUMagics(shell)
    shell.register_magics(magics)
    policy, warnings = startup_policy(magics)
    for warning in warnings:
        warn(warning)
    if policy is not None:
        report = magics.controller.set_policy(policy)
        if not report.ok:
            print(describe_report(report))
    return magics

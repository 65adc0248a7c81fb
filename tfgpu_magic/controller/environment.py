"""The environment the controller owns: the variables this tool set, what they were before, what it last
wrote, and restoring only what is still ours (a value the user set since is theirs, left as it is).

One job, so that the controller's other jobs (the policy, the frameworks' moments, the status) never
touch `os.environ` themselves: they hand the variables a plan wants (`Plan.env_map`) here, and get back
what changed.
"""

from __future__ import annotations

from typing import Callable, Mapping, MutableMapping

from ..envvars import NAMES, PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF
from ..tf.apply import VariableSet
from ..tf.runtime import RuntimeState

TooLate = Callable[[str, RuntimeState], "str | None"]
"""Why a change of a variable no longer takes effect in a state (None: it still does)."""


class OwnedEnvironment:
    """The process environment (`environ`) as far as this tool set it: each variable it set, as it was
    before (None: unset), until it is restored; what it last wrote there; and the variables the user set
    after it did, which it no longer restores (told once, in the next report)."""

    __slots__ = ("environ", "_original", "_written", "_left")

    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self.environ = environ
        self._original: dict[str, str | None] = {}
        """Each variable this tool set, as it was before (None: unset), until it is restored."""
        self._written: dict[str, str | None] = {}
        """What this tool last wrote to each of them: a different value there now is the user's."""
        self._left: list[tuple[str, str | None]] = []
        """Variables the user set after this tool did, which it no longer restores (for the next report)."""

    def current(self) -> dict[str, str]:
        """The variables this tool manages, as set in the environment now (by us or inherited)."""
        return {name: value for name in NAMES if (value := self.environ.get(name)) is not None}

    def inherited(self, name: str) -> str | None:
        """Variable `name` as it was before this tool set it."""
        return self._original[name] if name in self._original else self.environ.get(name)

    def inherited_environment(self) -> dict[str, str]:
        """The environment with the variables this tool set put back as they were: what a fresh process
        started without the policy gets."""
        environ = dict(self.environ)
        for name, value in self._original.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        return environ

    def alloc_conf(self) -> str | None:
        """PyTorch's allocator configuration as inherited, as torch reads it: `PYTORCH_CUDA_ALLOC_CONF`
        first (even empty), else `PYTORCH_ALLOC_CONF` (torch 2.13's CUDAAllocatorConfig::instance)."""
        old = self.inherited(PYTORCH_CUDA_ALLOC_CONF)
        return old if old is not None else self.inherited(PYTORCH_ALLOC_CONF)

    def take_left(self) -> list[tuple[str, str | None]]:
        """The variables left to the user since the last report (then forgotten: told once)."""
        left, self._left = self._left, []
        return left

    def diff(self, wanted: Mapping[str, str | None]) -> list[tuple[str, str | None, str | None]]:
        """(name, current, target) of our variables that differ from what a plan wants (`wanted`: None,
        unset), restoring the user's own value for those it no longer needs, unless the user set it since."""
        diff = []
        for name in NAMES:
            if name in wanted:
                target = wanted[name]
            elif name in self._original and not self._changed_since(name):
                target = self._original[name]
            else:
                continue
            current = self.environ.get(name)
            if current != target:
                diff.append((name, current, target))
        return diff

    def sync(self, wanted: Mapping[str, str | None], state: RuntimeState, too_late: TooLate) -> list[VariableSet]:
        """Set our variables as a plan wants them (`wanted`), restore those it no longer needs; returns
        what changed. Variables whose reader read them already (`too_late`)
        are left alone (`Plan.locked_env` reports them)."""
        for name in [name for name in self._original if name not in wanted and self._changed_since(name)]:
            self._forget(name)  # the user's value now: what this process inherits from here on
            self._left.append((name, self.environ.get(name)))
        changed = []
        for name, current, target in self.diff(wanted):
            if too_late(name, state):
                continue
            self._original.setdefault(name, current)
            if target is None:
                self.environ.pop(name, None)
            else:
                self.environ[name] = target
            self._written[name] = target
            if name not in wanted:  # restored: the user's again
                self._forget(name)
            changed.append(VariableSet(name, target))
        return changed

    def _changed_since(self, name: str) -> bool:
        """Whether variable `name` holds another value than this tool last wrote there: the user (or their
        code) set it since, so it is theirs, and nothing restores over it."""
        return name in self._written and self.environ.get(name) != self._written[name]

    def _forget(self, name: str) -> None:
        """Variable `name` is no longer this tool's to restore."""
        self._original.pop(name, None)
        self._written.pop(name, None)

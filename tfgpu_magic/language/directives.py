"""Every `%tfgpu` directive, declared once: its usage and help, arguments, options, kind, completions
and, for an edit, the status phrases of its part of a policy.

Parsing (`grammar`), dispatch and `%tfgpu?` (`views.magics`), Tab completion
(`views.completion`), the status and docs/grammar.md's grammar block all read this table, and each entry
carries what its directive does (`parse`, `run`). A new edit that sets one policy field from a
closed set of words is one entry here (plus the field); another edit is its entry plus its parser
(words → the policy fields it sets), registered on the entry with `@grammar.parses(name)`; an action
is its entry plus its function, registered with `views.actions.runs(name)`. Nothing else names it.
It holds data and small functions only, in plain classes (docs/architecture.md, "Rows", says why
not dataclasses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

from .words import ALL_GPUS, ALLOCATORS, LOGLEVELS

if TYPE_CHECKING:
    from .policy import Policy

USAGE_WIDTH = 39
"""Column where a usage line's help starts, in docs/grammar.md's grammar block and in `%tfgpu?`."""

CELL_USAGE = "%%tfgpu"
CELL_HELP = "cell form: one directive per line, checked as a whole (any order), all or nothing"

LOGLEVEL_OFF = "off"
"""The `loglevel` word for "TensorFlow's default" (`Policy.loglevel` None)."""

NOTES = (
    "SIZE: MiB (4096) or 512MB, 1.5GB, 2GiB, 3G (binary units, like TF and nvidia-smi), or NN%",
    "of the card's memory (needs the NVML inventory).",
    "GPUS: indices in nvidia-smi order (0,2 or 0-3), GPU UUIDs or unique UUID prefixes; in a kernel",
    "started with CUDA_VISIBLE_DEVICES (its grant), indices count within the grant, as CUDA numbers them.",
    "A word that starts with # begins a comment; $name and {expr} are not expanded.",
    "A %%tfgpu cell is checked as a whole: its lines may come in any order.",
    "Growth together with a limit or split is realised through TF_FORCE_GPU_ALLOW_GROWTH=true",
    "(TensorFlow refuses set_memory_growth on a GPU with logical devices).",
)
"""The SIZE / GPUS notes and the rules every directive shares, for `%tfgpu?`."""


class Form:
    """One usage line, exactly as docs/grammar.md's grammar block shows it, and its help ('' for none)."""

    __slots__ = ("usage", "help")

    def __init__(self, usage: str, help: str = "") -> None:
        self.usage, self.help = usage, help


class Option:
    """A `--name` option of one directive; `value` names its argument (None: a flag)."""

    __slots__ = ("name", "value", "help")

    def __init__(self, name: str, value: str | None, help: str) -> None:
        self.name, self.value, self.help = name, value, help


class Slot:
    """What Tab offers for one argument: closed words, and this machine's GPU indices if `gpus`.
    With `after`, only when the previous word is that one (`split off ` → GPUs or cpu)."""

    __slots__ = ("words", "gpus", "after")

    def __init__(self, words: tuple[str, ...] = (), gpus: bool = False, after: str | None = None) -> None:
        self.words, self.gpus, self.after = words, gpus, after


class Directive:
    """One directive of the language.

    name, kind: the first word, and whether it edits the policy or is an action.
    forms: its usage lines with their help (`usage`, `help`).
    synopsis: its arguments as an error's `usage:` shows them (default: the choices).
    arity: fewest and most positional arguments.
    choices: the closed set of its first argument, if it has one.
    field, values: for an edit that sets one policy field to a word's value (`growth on` → True).
    options: its `--options`.
    slots: completion of each argument position (None: free text, e.g. a size; default: the choices).
    examples: lines that parse (tests and fuzzing start from them).
    describe: for an edit, the status phrases of its part of a policy ([] for TF's default), given
    the policy and optionally the GPUs' nvidia-smi indices by UUID (`Names`).
    details: more than the usage line says, for `%tfgpu?` only ('' for nothing more).
    reports: the word its report is told as (`describe_report`'s action: "edit", "reset").

    How an edit is parsed is on the entry too, put there by `grammar` (`@parses`) when it is imported on
    the first `%tfgpu`, so that this module stays a cheap import:
    parse: words → an edit's `Edit.changes` (the policy fields it sets, in the policy's own form;
    `grammar.apply_edit` applies every edit alike) or an action's one argument; None for an edit that
    sets one field from `values`, or an action whose argument is one of `choices`. What an action
    runs is not here: `views.actions.ACTIONS` files it under the action's name.
    """

    __slots__ = ("name", "kind", "forms", "synopsis", "arity", "choices", "field", "values", "options", "slots",
                 "examples", "describe", "details", "reports", "parse")

    def __init__(
        self,
        name: str,
        kind: Literal["edit", "action"],
        forms: tuple[Form, ...],
        *,
        synopsis: str = "",
        arity: tuple[int, int] = (0, 0),
        choices: tuple[str, ...] = (),
        field: str | None = None,
        values: tuple[tuple[str, Any], ...] = (),
        options: tuple[Option, ...] = (),
        slots: tuple[Slot | None, ...] = (),
        examples: tuple[str, ...] = (),
        describe: Describe | None = None,
        details: str = "",
        reports: str = "edit",
        parse: Callable[..., Any] | None = None,
    ) -> None:
        self.name, self.kind, self.forms, self.arity = name, kind, forms, arity
        self.field, self.values, self.options, self.examples = field, values, options, examples
        self.details, self.reports = details, reports
        self.parse = parse
        self.choices = choices or tuple(word for word, _ in values)
        self.synopsis = synopsis or " | ".join(self.choices)
        self.slots = slots or ((Slot(self.choices),) if self.choices else ())
        self.describe = describe if describe is not None or field is None else self._describe_field

    def __repr__(self) -> str:
        return f"<directive {self.name}>"

    @property
    def usage(self) -> tuple[str, ...]:
        return tuple(form.usage for form in self.forms)

    @property
    def in_cell(self) -> bool:
        """Edits only: a cell is one policy change, checked as a whole; an action does something."""
        return self.kind == "edit"

    def value(self, word: str) -> Any:
        """The field value of a word of `choices` (a field edit)."""
        return dict(self.values)[word]

    def _describe_field(self, policy: Policy, names: Names | None = None) -> list[str]:
        """`growth on`, `loglevel error`: the first word that gives the field's value ([] for None)."""
        value = getattr(policy, self.field or "")
        if value is None:
            return []
        return [f"{self.name} {next(word for word, meant in self.values if meant == value)}"]


# ----- describe: a policy's part, as directive-like phrases -----------------------------------------
Names = Mapping[str, str]
"""GPU UUID → nvidia-smi index (from the inventory), so the status can name a GPU by its index."""
Describe = Callable[..., list[str]]
"""`describe(policy, names=None)`: a directive's part of a policy as status phrases."""


def gpu_name(ref: str, names: Names | None = None) -> str:
    """`GPU 1` for an index or a UUID whose index is known, else the UUID cut short (`GPU-b1c2d3e4…`)."""
    from .policy import is_index, short_uuid

    index = ref if is_index(ref) else (names or {}).get(ref)
    return f"GPU {index}" if index is not None else short_uuid(ref)


def gpu_names(refs: Sequence[str], names: Names | None = None) -> str:
    """`GPU 1, 2` (one `GPU` for the indices), then any UUID whose index is unknown, cut short."""
    shown = [gpu_name(ref, names) for ref in refs]
    indices = [name.removeprefix("GPU ") for name in shown if name.startswith("GPU ")]
    uuids = [name for name in shown if not name.startswith("GPU ")]
    return ", ".join(([f"GPU {', '.join(indices)}"] if indices else []) + uuids)


def _describe_limit(policy: Policy, names: Names | None = None) -> list[str]:
    """`limit 2GB on GPU 0, 4GB on every other visible GPU`: each size as the directive writes it, a
    share of the card as given with what it comes to there (`50% (40.0 GiB) on GPU 1, 2`)."""
    from .sizes import directive_size, mib_text

    limits = policy.limit_map
    default = limits.pop(ALL_GPUS, None)
    written = dict(policy.limits_written)
    sizes: dict[str, list[str]] = {}  # the size as shown (`50% (40.0 GiB)`) → its GPUs, in order
    for gpu, mib in limits.items():
        sizes.setdefault(f"{written[gpu]} ({mib_text(mib)})" if gpu in written else directive_size(mib), []).append(gpu)
    own = [f"{size} on {gpu_names(gpus, names)}" for size, gpus in sizes.items()]
    if default is not None:  # a split GPU is sized by its split, not by the limit on every GPU
        other = "every other visible GPU" if own or policy.splits else "every visible GPU"
        own.append(f"{directive_size(default)} on {other}")
    return ["limit " + ", ".join(own)] if own else []


def _describe_visible(policy: Policy, names: Names | None = None) -> list[str]:
    """`visible 0,1`; GPUs given by UUID as `2 (GPU-b2d4f6a8…)` where the index is known."""
    from .policy import is_index, short_uuid

    if policy.visible is None:
        return []
    if all(is_index(ref) for ref in policy.visible):
        return [f"visible {','.join(policy.visible) or 'none'}"]
    known = names or {}
    return ["visible " + ", ".join(f"{known[ref]} ({short_uuid(ref)})" if ref in known else short_uuid(ref)
                                   for ref in policy.visible)]


def _describe_gpu_splits(policy: Policy, names: Names | None = None) -> list[str]:
    """`split 0 2x1GB`, as the directive writes it; a GPU given by UUID by its index where known."""
    from .sizes import split_size

    return [f"split {gpu_name(gpu, names).removeprefix('GPU ')} {split_size(sizes)}" for gpu, sizes in policy.splits]


def _describe_split(policy: Policy, names: Names | None = None) -> list[str]:
    cpu = [f"split cpu into {policy.cpu_devices} logical devices"] if policy.cpu_devices is not None else []
    return _describe_gpu_splits(policy, names) + cpu


def _describe_nothing(policy: Policy, names: Names | None = None) -> list[str]:
    return []


def describe_policy(policy: Policy, names: Names | None = None) -> list[str]:
    """The whole policy as phrases (`visible 0`, `growth on`, ...), visible first as TF applies it,
    then how a field was chosen (`(visible: auto picked ...)`). With `names`, GPUs given by UUID are
    shown by their nvidia-smi index."""
    parts = [phrase for directive in DESCRIBE_ORDER
             for phrase in directive.describe(policy, names)]  # type: ignore[misc]
    return parts + [f"({field}: {why})" for field, why in policy.sources]


def policy_lines(policy: Policy) -> list[str]:
    """The policy as directive lines a `%%tfgpu` cell (or a notebook's `metadata.tfgpu.policy`) reads
    back to an equal policy, without the GPU inventory: sizes in MiB or GB (a share of a card as the
    MiB it came to), GPUs as written. A `visible auto` pick stays `visible auto:N`, to be picked again
    where the lines are read. `describe_policy` words a policy for people; these lines are for the
    grammar."""
    from .sizes import directive_size, split_size

    lines: list[str] = []
    if policy.picked_automatically:
        lines.append(f"visible auto:{len(policy.visible or ())}")
    elif policy.visible is not None:
        lines.append(f"visible {','.join(policy.visible) or 'none'}")
    lines += _BY_NAME["growth"].describe(policy)  # type: ignore[misc]
    limits = policy.limit_map
    every = limits.pop(ALL_GPUS, None)
    if every is not None:  # first: a limit on every GPU replaces the per-GPU ones, which then merge
        lines.append(f"limit {directive_size(every)}")
    lines += [f"limit {directive_size(mib)} {gpu}" for gpu, mib in limits.items()]
    lines += [f"split {gpu} {split_size(sizes)}" for gpu, sizes in policy.splits]
    if policy.cpu_devices is not None:
        lines.append(f"split cpu {policy.cpu_devices}")
    for name in ("allocator", "loglevel"):
        lines += _BY_NAME[name].describe(policy)  # type: ignore[misc]
    return lines


def gpu_asks(policy: Policy, names: Names | None = None) -> list[str]:
    """The policy's GPU settings that ask TensorFlow for more than its defaults, as status phrases:
    where TensorFlow sees no GPU, these are what has nothing to apply to (`growth off` and
    `allocator bfc` are what a GPU-less process has anyway)."""
    asks = _describe_visible(policy, names) + _describe_limit(policy, names) + _describe_gpu_splits(policy, names)
    if policy.growth:
        asks += spec("growth").describe(policy)  # type: ignore[misc]
    if policy.allocator is not None and ALLOCATORS[policy.allocator] is not None:
        asks += spec("allocator").describe(policy)  # type: ignore[misc]
    return asks


# ----- the registry ---------------------------------------------------------------------------------
LOGLEVEL_CHOICES = (*LOGLEVELS, LOGLEVEL_OFF)

def kernelspec_name(word: str) -> str:
    """`kernelspec NAME`: a name Jupyter accepts, lowercased as `jupyter kernelspec` stores it."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", word, re.ASCII):
        from ..errors import PolicyError
        from .policy import quote

        raise PolicyError(f"kernelspec: {quote(word)} is not a valid name; use letters, digits, '.', '_' and '-'")
    return word.lower()


REGISTRY: tuple[Directive, ...] = (
    Directive(
        "status", "action",
        (Form("%tfgpu", "status: TF state, desired policy, what TF has recorded"),),
        examples=("status",),
    ),
    Directive(
        "growth", "edit",
        (Form("%tfgpu growth on | off | all", "memory growth on every visible GPU (all is the same as on)"),),
        arity=(1, 1), field="growth", values=(("on", True), ("off", False), ("all", True)),
        examples=("growth on", "growth off"),
    ),
    Directive(
        "limit", "edit",
        (
            Form("%tfgpu limit SIZE [GPUS]", "hard memory cap on each listed GPU (default: every visible GPU)"),
            Form("%tfgpu limit off [GPUS]"),
        ),
        synopsis="SIZE [GPUS] | off [GPUS]", arity=(1, 2), slots=(Slot(("off",)), Slot(gpus=True)),
        examples=("limit 4096 0", "limit 1.5GB 0-3", "limit off 1", "limit 1GB GPU-8932f937", "limit 2GB"),
        describe=_describe_limit,
    ),
    Directive(
        "visible", "edit",
        (
            Form("%tfgpu visible GPUS | all | none", "which GPUs this kernel may use"),
            Form("%tfgpu visible auto[:N]", "the N GPUs with the most free memory, pinned by UUID (needs NVML)"),
        ),
        synopsis="GPUS | all | none", arity=(1, 1), slots=(Slot(("all", "none", "auto"), gpus=True),),
        examples=("visible 2,3", "visible none", "visible all"), describe=_describe_visible,
    ),
    Directive(
        "split", "edit",
        (
            Form("%tfgpu split GPU COUNTxSIZE", "virtual GPUs on one physical GPU, e.g. `split 0 2x2GB`"),
            Form("%tfgpu split GPU SIZE,SIZE,...", "e.g. `split 0 1GB,3GB`"),
            Form("%tfgpu split cpu COUNT", "COUNT logical CPU devices (simulates several devices)"),
            Form("%tfgpu split off [GPU | cpu]"),
        ),
        synopsis="GPU COUNTxSIZE | GPU SIZE,SIZE,... | cpu COUNT | off [GPU | cpu]", arity=(1, 2),
        slots=(Slot(("cpu", "off"), gpus=True), Slot(("cpu",), gpus=True, after="off")),
        examples=("split 0 2x2GB", "split 1 1GB,3GB", "split cpu 3", "split off cpu", "split off"),
        describe=_describe_split,
    ),
    Directive(
        "allocator", "edit",
        (Form("%tfgpu allocator bfc | async", "TF_GPU_ALLOCATOR (async = cuda_malloc_async)"),),
        arity=(1, 1), field="allocator", values=tuple((n, n) for n in ALLOCATORS),
        examples=("allocator async", "allocator bfc"),
    ),
    Directive(
        "loglevel", "edit",
        (Form(
            "%tfgpu loglevel " + " | ".join(LOGLEVEL_CHOICES),
            "lowest severity of TensorFlow's C++ and Python logs still shown (off: TF's default)",
        ),),
        arity=(1, 1), field="loglevel",
        values=(*((level, level) for level in LOGLEVELS), (LOGLEVEL_OFF, None)),
        examples=("loglevel error", "loglevel off"),
    ),
    Directive(
        "reset", "edit",
        (Form("%tfgpu reset", "forget the whole policy (and the env vars this tool set)"),),
        examples=("reset",), describe=_describe_nothing, reports="reset",
    ),
    Directive(
        "apply", "action",
        (Form("%tfgpu apply", "apply now if TF allows it (normally automatic)"),),
        examples=("apply",),
    ),
    Directive(
        "export", "action",
        (Form("%tfgpu export [python | env | json]", "the equivalent standalone code, ready to paste"),),
        arity=(0, 1), choices=("python", "env", "json"), examples=("export", "export json"),
    ),
    Directive(
        "restart", "action",
        (Form("%tfgpu restart [--yes]", "restart the kernel with the policy in force"),),
        options=(Option("--yes", None, "restart now, without asking"),), examples=("restart",),
        details="says what a restart loses and changes, then restarts through the Jupyter server (or an "
                "autorestarting manager); where nothing can restart the kernel, stores the policy and says "
                "how to restart from the front end",
    ),
    Directive(
        "panel", "action",
        (Form("%tfgpu panel", "the same policy as clickable widgets"),),
        examples=("panel",),
        details="needs ipywidgets in a notebook front end; the panel and %tfgpu edit one policy, each shows "
                "what the other changed",
    ),
    Directive(
        "doctor", "action",
        (Form("%tfgpu doctor [--json]", "why TensorFlow does (not) see a GPU"),),
        options=(Option("--json", None, "the checks as JSON"),), examples=("doctor",),
        details="one check a line (driver, NVML, CUDA libraries, TensorFlow's build, the GPUs it lists, "
                "CUDA_VISIBLE_DEVICES...), each with its verdict and, where one fails, the fix",
    ),
    Directive(
        "selftest", "action",
        (Form("%tfgpu selftest [--json]", "prove each setting works on this machine, in fresh processes"),),
        options=(Option("--json", None, "the verdicts as JSON"),), examples=("selftest",),
        details="each rule (split, visible, growth, limit, allocator, loglevel, locking...) applies one policy in a "
                "fresh Python process and measures it with this machine's TensorFlow and NVML: pass, fail or skip "
                "(and why); runs outside this kernel, whose TensorFlow stays untouched; in a terminal: "
                "python -m tfgpu_magic selftest",
    ),
    Directive(
        "memory", "action",
        (Form("%tfgpu memory", "per GPU: TF's tensors now/peak, this process, others, the cap"),),
        examples=("memory",),
        details="never imports or initializes TensorFlow; the figures as dicts: tfgpu_magic.memory()",
    ),
    Directive(
        "who", "action",
        (Form("%tfgpu who [--shutdown KERNEL_ID --yes]", "which notebook holds which GPU, and how idle it is"),),
        synopsis="[--shutdown KERNEL_ID --yes]",
        details="the processes on each GPU and your Jupyter kernels, with their notebooks and idle time; "
                "--shutdown KERNEL_ID --yes asks the server that owns that kernel to shut it down",
        options=(
            Option("--shutdown", "KERNEL_ID", "shut down one of your own kernels (needs --yes)"),
            Option("--yes", None, "confirm the shutdown"),
        ),
        examples=("who",),
    ),
    Directive(
        "watch", "action",
        (Form("%tfgpu watch on | off", "after each cell, a line per GPU whose memory moved"),),
        arity=(1, 1), choices=("on", "off"), examples=("watch on", "watch off"),
        details="off removes the hook: cells pay nothing when it is off",
    ),
    Directive(
        "default", "action",
        (Form("%tfgpu default save | clear | show", "the policy every kernel starts with"),),
        arity=(1, 1), choices=("save", "clear", "show"), examples=("default show",),
    ),
    Directive(
        "autoload", "action",
        (Form("%tfgpu autoload on | off", "load the extension in every new kernel of the profile"),),
        arity=(1, 1), choices=("on", "off"), examples=("autoload off",),
    ),
    Directive(
        "kernelspec", "action",
        (Form("%tfgpu kernelspec NAME [--display-name TEXT] [--slurm ARGS] [--remove]",
              "a Jupyter kernel that starts with this policy"),),
        synopsis="NAME [--display-name TEXT] [--slurm ARGS] [--remove]", arity=(1, 1), slots=(None,),
        details="--slurm \"--partition=gpu --time=2:00:00 --gres=gpu:1\" makes the kernel a Slurm job (sbatch "
                "options; the notebook's own GPU count wins over the options')",
        options=(
            Option("--display-name", "TEXT", "the name shown in the launcher"),
            Option("--slurm", "ARGS", "run the kernel as a Slurm job with these sbatch options"),
            Option("--remove", None, "uninstall it"),
        ),
        examples=("kernelspec tf-gpu0",), parse=lambda args: kernelspec_name(args[0]),
    ),
)

_BY_NAME = {directive.name: directive for directive in REGISTRY}

EDITS = tuple(d.name for d in REGISTRY if d.kind == "edit")
ACTIONS = tuple(d.name for d in REGISTRY if d.kind == "action")
NAMES = EDITS + ACTIONS
"""Every directive name, edits first (the order an unknown directive's message lists them in)."""
CELL_NAMES = tuple(d.name for d in REGISTRY if d.in_cell)
def _options() -> dict[str, tuple[tuple[Directive, ...], Option]]:
    table: dict[str, tuple[tuple[Directive, ...], Option]] = {}
    for directive in REGISTRY:
        for option in directive.options:
            owners, first = table.get(option.name, ((), option))
            table[option.name] = ((*owners, directive), first)
    return table


OPTIONS = _options()
"""`--name` → (the directives it belongs to, the option as the first of them declares it; an option
shared by several takes a value in all of them or in none)."""

DESCRIBE_ORDER = tuple(sorted((d for d in REGISTRY if d.describe is not None), key=lambda d: d.name != "visible"))
"""The status lists which GPUs first (what every other setting applies to), then the registry's order."""


def lookup(name: str) -> Directive | None:
    """The directive called `name` (any case), None for an unknown word."""
    return _BY_NAME.get(name.lower())


def spec(name: str) -> Directive:
    """The directive called exactly `name`, which the code names (`KeyError` is a bug, not input)."""
    return _BY_NAME[name]


# ----- help text --------------------------------------------------------------------------------------
def usage_line(usage: str, help: str) -> str:
    """`usage` with its help at `USAGE_WIDTH`; a usage too long for the column puts the help below."""
    if not help:
        return usage
    if len(usage) < USAGE_WIDTH:
        return f"{usage:<{USAGE_WIDTH}}{help}"
    return f"{usage}\n{' ' * USAGE_WIDTH}{help}"


def grammar_lines() -> list[str]:
    """docs/grammar.md's grammar block: every usage line with its help, then the cell form."""
    lines = [usage_line(form.usage, form.help) for directive in REGISTRY for form in directive.forms]
    return "\n".join([*lines, usage_line(CELL_USAGE, CELL_HELP)]).split("\n")


def option_lines() -> list[str]:
    """One line per option: `--display-name TEXT    with kernelspec: the name shown in the launcher`."""
    lines = []
    for directive in REGISTRY:
        for option in directive.options:
            shown = f"{option.name} {option.value}" if option.value else option.name
            lines.append(f"{shown:<23}with {directive.name}: {option.help}")
    return lines


def detail_lines(width: int = 100) -> list[str]:
    """`%tfgpu?`'s word on the directives whose usage line needs more: `restart  says what ...`,
    wrapped to `width`."""
    import textwrap

    column = 2 + max(len(d.name) for d in REGISTRY) + 2
    return [line for d in REGISTRY if d.details
            for line in textwrap.wrap(d.details, width, initial_indent=f"  {d.name:<{column - 2}}",
                                      subsequent_indent=" " * column, break_on_hyphens=False)]


def help_text(summary: str) -> str:
    """The magic's docstring (`%tfgpu?`): `summary`, every directive, the notes, more on some
    directives, the options. It stands on its own: nothing in it points elsewhere."""
    indent = "  "
    return "\n".join([
        summary,
        "",
        "Directives (one per line in a %%tfgpu cell, all or nothing)::",
        "",
        *(indent + line for line in grammar_lines()),
        "",
        *NOTES,
        "",
        "More on some directives::",
        "",
        *detail_lines(),
        "",
        "Options::",
        "",
        *(indent + line for line in option_lines()),
    ])

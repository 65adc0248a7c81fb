"""Hypothesis strategies for directive lines: random text and mutations of valid lines.

`FUZZ_EXAMPLES` (env `TFGPU_FUZZ_EXAMPLES`, default 300) sets how many each fuzz test tries;
`make soak` raises it to 100,000.
"""

from __future__ import annotations

import os

from hypothesis import strategies as st

from tfgpu_magic.language.directives import NAMES, REGISTRY

FUZZ_EXAMPLES = int(os.environ.get("TFGPU_FUZZ_EXAMPLES", "300"))

_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters=_LINE_BREAKS)
VALID = [example for directive in REGISTRY for example in directive.examples]
"""Every directive's examples (the registry's): each one parses."""
TOKENS = [*NAMES, *sorted({word for directive in REGISTRY for word in directive.choices}),
          "none", "cpu", "0", "-1", "0-3", "3-1", "0,,1", "2x", "x2GB", "50%", "1e3", "inf", "'", '"', "#", ",",
          "99999999999", "GPU-", "1GB,", "×", "²", "١", "1" * 5000, "0#1", "４GB", "٣", "$gpu", "{gpu}", "GB", "auto:",
          "GPU-\u212a", "--yes", "--remove", "--display-name"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid line with a few words dropped, repeated, swapped or replaced."""
    words = draw(st.sampled_from(VALID)).split()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(words)))
        kind = draw(st.sampled_from(["drop", "dup", "token", "text", "swap"]))
        if kind == "drop" and words:
            del words[min(at, len(words) - 1)]
        elif kind == "dup" and words:
            words.insert(at, words[min(at, len(words) - 1)])
        elif kind == "swap" and len(words) > 1:
            words[0], words[-1] = words[-1], words[0]
        elif kind == "token":
            words.insert(at, draw(st.sampled_from(TOKENS)))
        else:
            words.insert(at, draw(st.text(_CHARS, min_size=1, max_size=6)))
    return " ".join(words)


def directive_lines() -> st.SearchStrategy[str]:
    """Any one-line text, or a valid directive with a few words dropped, repeated or replaced."""
    return st.one_of(st.text(_CHARS, max_size=40), mutated())

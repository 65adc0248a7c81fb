#!/usr/bin/env python
"""`make bench-against REV=<git revision>`: this tree against an earlier revision, same snippets, same run.

The figures of `benchmarks/run.py` are ratios against a baseline (a shell start, TensorFlow's own
import). Whether a change made them worse is a comparison between two versions of tfgpu_magic, so
this script measures exactly that: the revision is checked out into a temporary git worktree, and
each sample runs the same snippet in a fresh interpreter twice, once importing tfgpu_magic from
that worktree and once from this tree (PYTHONPATH, from a neutral working directory), in
back-to-back pairs alternating which goes first. A figure is the median of the per-pair ratios
this tree / the revision; above 1 + TOLERANCE it is reported as worse.

Both trees run in this environment (same Python, IPython, TensorFlow, bytecode cache settings as
`run.py`), so only tfgpu_magic differs. Exit status 1 if any figure is worse.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import run

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.05
"""What two runs of the same tree differ by here (shell start against itself: within 2 %, ×2 margin)."""

PANEL = run.PANEL.replace(
    "    from tfgpu_magic.views.panel import Panel\n",
    "    try:\n"
    "        from tfgpu_magic.views.panel import Panel\n"
    "    except ImportError:  # before the subpackage layout\n"
    "        from tfgpu_magic.panel import Panel\n",
)
"""The panel snippet, for revisions where the panel lived in `tfgpu_magic.panel`."""

FIGURES: list[tuple[str, str, Callable[[dict[str, Any]], float]]] = [
    ("shell start (no tfgpu_magic: same in both)", run.SHELL_START, lambda r: r["seconds"]),
    ("%load_ext", run.EXTENSION, lambda r: r["load"]),
    ("first %tfgpu status", run.EXTENSION, lambda r: r["status"]),
    ("panel first display", PANEL, lambda r: r["seconds"]),
    ("policy apply on import", run.tf_import_snippet(True),
     lambda r: r["applies"][0] if r["applies"] else float("nan")),
    ("import tensorflow with the extension", run.tf_import_snippet(True),
     lambda r: r["seconds"]),
]
"""(name, snippet, what to read from its result); figures sharing a snippet share its samples."""


def worktree(revision: str) -> Path:
    """A temporary checkout of `revision`, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="tfgpu_magic-against-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), revision],
                   check=True)
    atexit.register(lambda: subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                                           check=False, capture_output=True))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare against (e.g. a commit or tag)")
    parser.add_argument("--repeat", type=int, default=9, help="pairs per snippet (default 9)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the figures whose name contains TEXT (repeatable)")
    args = parser.parse_args(argv)
    old_tree = worktree(args.revision)
    workdir = Path(tempfile.mkdtemp(prefix="tfgpu_magic-against-run-"))
    atexit.register(shutil.rmtree, workdir, True)
    env = dict(run.child_env(workdir, pyc_cache=True))
    os.chdir(workdir)  # `python -c` puts the working directory first on sys.path: no tree there
    benches = {which: run.Bench(args.repeat, 1, tuple(sorted({**env, "PYTHONPATH": str(tree)}.items())))
               for which, tree in (("baseline", old_tree), ("measured", ROOT))}
    figures = [f for f in FIGURES if not args.only or any(text in f[0] for text in args.only)]
    samples: dict[str, tuple[list[dict], list[dict]]] = {}
    rows = []
    for name, snippet, read in figures:
        if snippet not in samples:
            run.progress(f"{name}: {args.repeat} pairs, {args.revision} against this tree")
            samples[snippet] = run.paired(lambda which: run.fresh(benches[which], snippet), args.repeat)
        old, new = samples[snippet]
        row = run.ratio_row(name, [read(r) for r in new], [read(r) for r in old], 1 + TOLERANCE)
        rows.append(row._replace(note="" if row.ok else "worse than " + args.revision))
    print(f"this tree against {args.revision}: medians of {args.repeat} back-to-back pairs "
          f"(value: this tree, baseline: {args.revision}, ratio: this tree / {args.revision})")
    print("machine: " + ", ".join(f"{key} {value}" for key, value in run.machine().items()))
    print()
    print(run.table(rows))
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

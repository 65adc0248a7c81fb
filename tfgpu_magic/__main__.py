"""`python -m tfgpu_magic selftest [--json] [--only RULE,...]`: prove on this machine that each rule of
the policy takes effect (docs/selftest.md). Exit status 1 when a rule fails, 2 for a usage error."""

from __future__ import annotations

import argparse
import sys
import time


def rule_names(text: str) -> list[str]:
    """`--only`'s value: known rule names, comma-separated."""
    from .selftest.rules import NAMES

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown rule {', '.join(map(repr, unknown)) or '(none given)'}; "
                                         f"the rules: {', '.join(NAMES)}")
    return names


def workers(text: str) -> int:
    count = int(text) if text.isdigit() else 0
    if not 1 <= count <= 64:
        raise argparse.ArgumentTypeError(f"not a number of processes from 1 to 64: {text!r}")
    return count


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m tfgpu_magic", description="tfgpu_magic from the command line.")
    commands = top.add_subparsers(dest="command", required=True, metavar="selftest")
    selftest = commands.add_parser(
        "selftest", help="prove, in fresh processes, that each rule of the policy takes effect here",
        description="Each rule runs in a fresh process of this Python: it applies one policy and measures the "
                    "outcome with the TensorFlow (and GPUs) installed here. Exit status 1 when a rule fails.")
    selftest.add_argument("--json", action="store_true", help="the verdicts as a JSON list (share it from a GPU)")
    selftest.add_argument("--only", type=rule_names, metavar="RULE[,RULE...]", help="run only these rules")
    selftest.add_argument("--workers", type=workers, metavar="N",
                          help="processes side by side (default: one per core, 2 to 8)")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from .selftest.report import failed, to_json
    from .selftest.run import default_workers, selftest
    from .views.selftest import text

    count = args.workers or default_workers()
    start = time.monotonic()
    rows = selftest(only=args.only, workers=count)
    print(to_json(rows) if args.json else text(rows, time.monotonic() - start, count))
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())

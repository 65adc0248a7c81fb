"""`python -m tfgpu_magic selftest [--json] [--only RULE,...] [--timeout S] [--deadline S]`: prove on
this machine that each rule of the policy takes effect (docs/selftest.md). Plain text prints each
rule as it is decided. Exit status 1 when a rule fails, 2 for a usage error, 130 when interrupted.
SIGINT ignored from the start (a script's background job, `cmd &`) stays ignored, as Python leaves it;
SIGTERM stops the run then."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from typing import Any, Iterator


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


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 24 * 3600:  # also refuses nan
        raise argparse.ArgumentTypeError(f"not a number of seconds from 0 to 86400: {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    from .selftest.run import DEADLINE, PROBE_TIMEOUT

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
    selftest.add_argument("--timeout", type=seconds, metavar="S", default=PROBE_TIMEOUT,
                          help=f"seconds one process may take (default {PROBE_TIMEOUT:.0f})")
    selftest.add_argument("--deadline", type=seconds, metavar="S", default=DEADLINE,
                          help=f"seconds the whole run may take; rules not done by then are skipped "
                               f"(default {DEADLINE:.0f})")
    # For `%tfgpu selftest` (`selftest.run.run_outside`): each row as a line framed with NONCE as it is
    # decided, and the run stops when stdin reaches EOF (the kernel that started it is gone).
    selftest.add_argument("--frames", metavar="NONCE", help=argparse.SUPPRESS)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from .selftest import frames
    from .selftest.children import watch_parent
    from .selftest.report import Row, failed, to_json
    from .selftest.run import default_workers, selftest
    from .views.selftest import block, opening, summary

    count = args.workers or default_workers()
    start = time.monotonic()

    def framed(row: Row) -> None:
        frames.write(args.frames, row._asdict())

    def printed(row: Row) -> None:
        print(block(row), flush=True)

    on_row = framed if args.frames else None if args.json else printed
    if args.frames:
        watch_parent(lambda: os.kill(os.getpid(), signal.SIGTERM))
    elif not args.json:
        print(opening(args.timeout, args.deadline), flush=True)
    with exits_on_termination():
        try:
            rows = selftest(only=args.only, workers=count, timeout=args.timeout, deadline=args.deadline,
                            on_row=on_row)
        except KeyboardInterrupt:
            print("tfgpu_magic selftest: interrupted; the processes it started are stopped", file=sys.stderr)
            return 130
    if args.json:
        print(to_json(rows))
    elif not args.frames:
        print(summary(rows, time.monotonic() - start, count))
    return 1 if failed(rows) else 0


@contextlib.contextmanager
def exits_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run as an exception does (`SystemExit`), so that the processes it
    started are stopped on the way out; their handlers as they were afterwards."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    saved = {signum: signal.signal(signum, leave) for signum in (signal.SIGTERM, signal.SIGHUP)
             if signal.getsignal(signum) is not signal.SIG_IGN}  # `nohup` stays nohup
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())

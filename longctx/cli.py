"""The ``longctx`` command (``python -m longctx.cli``, which is also what torchrun runs).

Each subcommand lives in its own module of ``longctx.commands`` exposing ``add_parser(subparsers)``
and ``run(args) -> int``; they keep heavy imports (datatrove, torch) inside ``run`` so that
``longctx --help`` is instant. The commands that tokenize (``curate``, ``pack``) first
execute themselves again with a faster ``malloc`` when one is installed (:mod:`longctx.core.allocator`).
User errors (:class:`~longctx.core.errors.LongctxError`) print one
line and exit with status 2, without a traceback. When the reader of the output stops reading
(``longctx inspect ... | head``), the command stops quietly, with status 141 as a Unix tool that
SIGPIPE ended.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys

# subcommand name -> module implementing it
COMMANDS: dict[str, str] = {
    "curate": "longctx.commands.curate",
    "pack": "longctx.commands.pack",
    "inspect": "longctx.commands.inspect",
    "train": "longctx.commands.train",
    "plan": "longctx.commands.plan",
    "eval": "longctx.commands.eval",
    "demo": "longctx.commands.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longctx",
        description="Long-document continued pretraining: curate, pack, train and evaluate.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for _name, module_name in COMMANDS.items():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``longctx`` console script."""
    from longctx.core.errors import LongctxError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if argv is None and getattr(args, "fast_allocator", False):
            from longctx.core.allocator import reexec_with_allocator

            reexec_with_allocator(sys.argv[1:])  # returns only when it did not execute the command again
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # what is still buffered: a reader that has gone is met here, not at exit
        return status
    except BrokenPipeError:
        if not _reader_gone():
            raise
        return 128 + signal.SIGPIPE  # as a Unix tool that SIGPIPE ended (the shell shows 141)
    except LongctxError as err:
        print(f"longctx {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"longctx {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _reader_gone() -> bool:
    """Whether what reads this command's output has stopped reading (``longctx inspect ... | head``);
    if so, the output goes to /dev/null from now on, so that nothing fails again on its way out."""
    try:
        stdout = sys.stdout.fileno()
        poll = select.poll()
        poll.register(stdout, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no file descriptor, or no poll() here
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout)
        os.close(devnull)
    return gone


if __name__ == "__main__":
    sys.exit(main())

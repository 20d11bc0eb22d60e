"""The ``longctx`` subcommands, one module each with ``add_parser(subparsers)`` and ``run(args) -> int``.

Each keeps its heavy imports (datatrove, torch) inside ``run`` so that ``longctx --help`` is instant,
and hands each job only its own config section.
"""

from __future__ import annotations

from pathlib import Path


def local_path(value: str | None, flag: str, instead: str = "") -> Path | None:
    """``value`` of the command-line ``flag`` as a local path; a one-line error when it is a URL
    (``s3://...``), which ``Path`` would silently turn into a local folder named ``s3:``.
    ``instead`` says what to use to reach object storage."""
    from longctx.core.errors import ConfigError
    from longctx.core.remote import is_remote

    if value is None:
        return None
    if is_remote(value):
        raise ConfigError(
            f"{flag} {value}: a URL, but {flag} takes a local path" + (f"; {instead}" if instead else "")
        )
    return Path(value)


def check_counts(counts: dict[str, int | None]) -> None:
    """Refuse a count given on the command line (``{"--nproc": 0}``; None: not given) below 1, in one
    line naming the flag: none is taken as 1 or as "unset"."""
    from longctx.core.errors import ConfigError

    for flag, value in counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be at least 1")

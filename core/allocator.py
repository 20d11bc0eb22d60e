"""A faster ``malloc`` for the commands that tokenize: mimalloc (or jemalloc), preloaded when installed.

``tokenizers`` allocates and frees several small buffers per word and per token (the pieces of the
normalized text, the token strings of every encoding). Under glibc's allocator, ``perf`` puts a third
of a curation's CPU in ``malloc`` and ``free``; curation's tokenizer calls take about 0.68x of their
CPU with mimalloc and 0.86x with jemalloc (one thread, the same texts; ``bench_curate.py`` times the
tokenizer on the system's allocator and on the one curation runs with, and curation on it).
An allocator must be chosen before a process allocates anything, so ``longctx curate`` and
``longctx pack`` execute themselves once more, at their start, with the library in ``LD_PRELOAD``: the
way PyTorch's ``torch.backends.xeon.run_cpu`` launcher preloads jemalloc or tcmalloc. Every process of
the command (its forkserver and workers) then uses it. The outputs are the same bytes.

``LONGCTX_ALLOCATOR`` chooses:

* ``auto`` (the default, also when unset): the first of :data:`LIBRARIES` found in the system's
  library folders (:func:`library_dirs`); the system's own allocator when none is;
* ``system``: never preload anything;
* a path to a shared library: that one (a one-line error when it is not a file).

Only on Linux, only for a process that is the ``longctx`` command itself (never a Python session that
calls :func:`longctx.cli.main`), and never twice: the executed command finds :data:`MARKER` set.
Nothing is preloaded when ``LD_PRELOAD`` already names an allocator. A command whose stages run
elsewhere (Slurm, Ray) takes the library out of the environment its jobs inherit
(:func:`keep_from_children`), since other machines may not have it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

from longctx.core.errors import ConfigError

ENV = "LONGCTX_ALLOCATOR"
"""The environment variable that chooses: ``auto``, ``system`` or a library's path."""
MARKER = "LONGCTX_ALLOCATOR_PRELOADED"
"""Set (to the library's path) in the environment of the command executed with the library."""
LIBRARIES = ("libmimalloc.so.2", "libmimalloc.so", "libjemalloc.so.2", "libjemalloc.so")
"""The allocators looked for, best first (Debian/Ubuntu: ``libmimalloc2.0``, ``libjemalloc2``;
conda: ``mimalloc``, ``jemalloc``)."""
STARTED_WITH = os.environ.get(MARKER) or None
"""The library this process was executed with (read when this module is first imported: before
:func:`keep_from_children` takes it out of the environment)."""
_ALLOCATOR_NAMES = ("mimalloc", "jemalloc", "tcmalloc")
"""A library in ``LD_PRELOAD`` whose file name holds one of these is an allocator already."""


def library_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The folders searched, in order: the active conda environment's and this interpreter's
    ``lib``, then the system's (``/usr/local/lib``, the multiarch folder such as
    ``/usr/lib/x86_64-linux-gnu``, ``/usr/lib64``, ``/usr/lib``)."""
    env = os.environ if environ is None else environ
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [Path(env["CONDA_PREFIX"]) / "lib"] if env.get("CONDA_PREFIX") else []
    dirs += [Path(sys.base_prefix) / "lib", Path("/usr/local/lib", multiarch), Path("/usr/local/lib")]
    dirs += [Path("/usr/lib", multiarch), Path("/usr/lib64"), Path("/usr/lib")]
    return list(dict.fromkeys(dirs))


def find_allocator(dirs: Sequence[Path]) -> Path | None:
    """The first of :data:`LIBRARIES` (in that order of preference) that is a file in ``dirs``, as
    found there (a symbolic link is not followed here)."""
    for name in LIBRARIES:
        for folder in dirs:
            if (folder / name).is_file():
                return folder / name
    return None


def allocator_to_preload(environ: Mapping[str, str], dirs: Sequence[Path] | None = None) -> Path | None:
    """The library the command should execute itself with, or None: not on Linux, already done
    (:data:`MARKER`), ``LONGCTX_ALLOCATOR=system``, an allocator already in ``LD_PRELOAD``, or none
    installed. Raises :class:`ConfigError` for a value of ``LONGCTX_ALLOCATOR`` that is neither
    ``auto``, ``system`` nor a file."""
    choice = environ.get(ENV, "auto").strip() or "auto"
    chosen = None if choice in ("auto", "system") else Path(choice).expanduser()
    if chosen is not None and not chosen.is_file():
        raise ConfigError(
            f"{ENV}={choice}: no such library file (use auto, system or the path of a shared library "
            "such as /usr/lib/x86_64-linux-gnu/libmimalloc.so.2)"
        )
    preloaded = [Path(entry).name for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split()]
    if (
        choice == "system"
        or not sys.platform.startswith("linux")
        or environ.get(MARKER)
        or any(name in entry for entry in preloaded for name in _ALLOCATOR_NAMES)
    ):
        return None
    found = chosen or find_allocator(library_dirs(environ) if dirs is None else dirs)
    return None if found is None else found.resolve()  # the file the loader maps (not a symbolic link)


def is_command_process(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (the arguments being run) are this process's own command line: the process is
    the ``longctx`` command (its console script or ``python -m longctx.cli``), not a Python session
    or a test calling the CLI's ``main`` with arguments of its own."""
    own = sys.orig_argv
    return bool(argv) and len(own) > len(argv) and own[-len(argv) :] == list(argv)


def reexec_with_allocator(argv: Sequence[str]) -> None:
    """Execute this command again with the allocator in ``LD_PRELOAD`` (same process id, same
    arguments, same working folder) when :func:`allocator_to_preload` names one and this process is
    the command (:func:`is_command_process`); otherwise return and run on as is. An execution that
    fails (the interpreter cannot be executed again) is not an error: the command runs on."""
    if not is_command_process(argv):
        return
    library = allocator_to_preload(os.environ)
    if library is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    env[MARKER] = str(library)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return


def preloaded_allocator() -> str | None:
    """The allocator library this process was executed with (:data:`STARTED_WITH`), when it is
    mapped in the process; None otherwise (the system's allocator)."""
    library = STARTED_WITH
    if not library:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            mapped = any(line.rstrip().endswith(library) for line in maps)
    except OSError:
        return None
    return library if mapped else None


def allocator_note() -> str:
    """``"; malloc: <library>"`` for a command's closing line when it runs with a preloaded
    allocator, ``""`` with the system's."""
    library = preloaded_allocator()
    return f"; malloc: {library}" if library else ""


def keep_from_children() -> None:
    """Take the preloaded library out of the environment that this process's children inherit (jobs
    submitted to Slurm or Ray run on machines that may not have it); this process keeps using it."""
    library = os.environ.pop(MARKER, None)
    if not library:
        return
    rest = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and p != library]
    if rest:
        os.environ["LD_PRELOAD"] = ":".join(rest)
    else:
        os.environ.pop("LD_PRELOAD", None)

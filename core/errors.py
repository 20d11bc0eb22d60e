"""User errors: the ``longctx`` command prints their message on one line, without a traceback."""

from __future__ import annotations


class LongctxError(Exception):
    """Base of the errors that explain a problem with the input, the config or the run folder."""


class ConfigError(LongctxError, ValueError):
    """A configuration file is malformed, names an unknown key, has a wrong type or a missing path."""


class OutputError(LongctxError, OSError):
    """An output folder or file cannot be written: it is not a folder, the file system is read-only,
    the disk is full. Also an ``OSError``, so that code catching those still does."""


class EngineError(LongctxError):
    """The engine a config names to run a job on is missing or out of reach: an extra that is not
    installed (ray), a command not on the PATH (sbatch), a cluster that does not answer."""

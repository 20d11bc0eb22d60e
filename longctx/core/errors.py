"""User errors: the ``longctx`` command prints their message on one line, without a traceback."""

from __future__ import annotations


class LongctxError(Exception):
    """Base of the errors that explain a problem with the input, the config or the run folder."""


class ConfigError(LongctxError, ValueError):
    """A configuration file is malformed, names an unknown key, has a wrong type or a missing path."""

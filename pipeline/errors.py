"""Errors a user can act on. The ``longctx`` command prints them as one message and exits with
status 2, without a traceback; anything else is a bug and keeps its traceback."""


class LongctxError(Exception):
    """Base of the errors that explain a problem with the input, the config or the run folder."""

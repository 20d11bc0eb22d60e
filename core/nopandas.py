"""pyarrow without pandas in the processes of the ``curate`` and ``pack`` commands.

When pandas is installed, pyarrow imports it the first time it is given Python objects (``pa.array``
of a list, ``pa.table`` of a dict), to see whether they are pandas objects, and remembers the answer
for the rest of the process. Nothing in these jobs converts to or from pandas, and the import costs
0.2-0.3 s of CPU in every process that makes it: in the command's own process it falls in the
single-task stages, where the other cores wait; a forkserver imports it for its workers before
it forks the first one.

:func:`pyarrow_without_pandas` makes pyarrow's one look find pandas missing, so that it never looks
again in this process or in any process forked from it. It is meant only for a process that is one
of these commands: elsewhere (a user's Python session) ``Table.to_pandas`` would stop working.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

PANDAS = "pandas"

_active = False


class _RefusePandas(importlib.abc.MetaPathFinder):
    """Import finder under which ``import pandas`` fails, as when pandas is not installed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if name == PANDAS:
            raise ImportError(f"{PANDAS} is not used by this longctx command")


def pyarrow_without_pandas() -> bool:
    """Make pyarrow in this process (and in the processes forked from it) work as if pandas were not
    installed, unless pyarrow has looked for pandas here already or pandas is imported. Returns
    whether pyarrow now works without pandas here (:func:`active`)."""
    global _active
    if _active:
        return True
    if PANDAS in sys.modules:
        return False
    import pyarrow as pa

    finder = _RefusePandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # pyarrow's first look for pandas: it finds none, and remembers that
    finally:
        sys.meta_path.remove(finder)
    _active = PANDAS not in sys.modules
    return _active


def active() -> bool:
    """Whether :func:`pyarrow_without_pandas` took effect in this process (or in the one it was
    forked from)."""
    return _active

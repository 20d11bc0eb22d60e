"""What finding Python imports costs in code curation: the outline against parsing the whole file.

``python_imports`` (``pipeline/readers/code_order/python.py``) parses each file's outline (literals
and comments emptied, function bodies made ``pass``) and the whole file only when the outline does
not parse. Measured in one run, ``--reps`` interleaved repetitions (the order reversed every other
one), median [min-max] of CPU and wall seconds, ratios of medians against ``reference``:

* ``reference``: ``ast.parse`` of the whole file with the garbage collector left on, then the same
  walk (:func:`load_time_imports`): ``python_imports`` as it was before the collector was paused and
  before the outline;
* ``whole parse``: ``parsed_imports``, the whole file parsed with the collector paused (the fallback);
* ``python_imports``: the function as shipped, over every file;
* ``parse floor``: ``symtable.symtable`` over every file: CPython's parser without building Python
  ``ast`` objects (plus its cheap symbol-table pass), the least any method that parses the whole file
  pays;
* ``file_dependencies``: the whole dependency step, one call per package (imports resolved too),
  once as shipped and once with ``reference`` in place of ``python_imports``.

It also counts the files whose imports differ from ``reference`` (only files whose syntax errors are
all inside function bodies may).

``--live-objects N`` keeps N small lists alive during the run, as a curation worker keeps its
tokenizer and pipeline: a full collection scans every live object, so collections cost more there.

The files are the standard-library packages ``bench_curate.py`` uses as code repositories (without
their ``test``/``tests`` folders), or with ``--all`` every ``.py`` file of the standard library
outside such folders.

    .venv/bin/python tests/benchmarks/bench_code_order.py [--reps 5] [--all] [--live-objects N]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import symtable
import sysconfig
import warnings
from pathlib import Path

from bench_curate import CODE_PACKAGES
from benchtools import Samples

from longctx.pipeline.readers.code_order import (
    PythonImport,
    dependencies,
    file_dependencies,
    load_time_imports,
    python_imports,
)
from longctx.pipeline.readers.code_order.python import parsed_imports


def read_packages(all_stdlib: bool) -> dict[str, dict[str, str]]:
    """Package name -> (relative path -> text) of the Python files read, UTF-8 files only."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if all_stdlib:
        roots = {"stdlib": stdlib}
    else:
        roots = {name: stdlib / name for name in CODE_PACKAGES if (stdlib / name).is_dir()}
    packages: dict[str, dict[str, str]] = {}
    for name, root in roots.items():
        files = {}
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if {"test", "tests", "site-packages", "__pycache__"} & set(rel.parts[:-1]):
                continue
            try:
                files[rel.as_posix()] = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
        packages[name] = files
    return packages


def reference(source: str) -> list[PythonImport]:
    """``python_imports`` before the garbage collector was paused during the parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return load_time_imports(tree)


def dependencies_with_reference(packages: dict[str, dict[str, str]]) -> None:
    """``file_dependencies`` of every package with :func:`reference` finding the imports."""
    shipped = dependencies.python_imports
    dependencies.python_imports = reference
    try:
        for name, files in packages.items():
            file_dependencies(files, name)
    finally:
        dependencies.python_imports = shipped


def parse_floor(texts: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for text in texts:
            with contextlib.suppress(SyntaxError, ValueError, RecursionError, MemoryError):
                symtable.symtable(text, "<source>", "exec")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--all", action="store_true", help="every .py file of the stdlib outside test folders"
    )
    parser.add_argument("--live-objects", type=int, default=0, help="small lists kept alive during the run")
    args = parser.parse_args()
    live = [[] for _ in range(args.live_objects)]  # kept until the end of main
    packages = read_packages(args.all)
    texts = [text for files in packages.values() for text in files.values()]
    print(
        f"{len(texts)} Python files, {sum(map(len, texts)) / 1e6:.1f} MB, "
        f"{len(packages)} packages; {args.reps} reps"
    )

    contenders = {
        "reference": lambda: [reference(t) for t in texts],
        "python_imports": lambda: [python_imports(t) for t in texts],
        "whole parse": lambda: [parsed_imports(t) for t in texts],
        "parse floor": lambda: parse_floor(texts),
        "file_dependencies": lambda: [file_dependencies(files, name) for name, files in packages.items()],
        "file_deps reference": lambda: dependencies_with_reference(packages),
    }
    samples = {name: Samples() for name in contenders}
    for rep in range(args.reps):
        order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
        for name in order:
            samples[name].run(contenders[name])
    base = samples["reference"]
    for name, sample in samples.items():
        print(
            f"{name:19s} {sample}   vs reference: CPU {sample.median_cpu / base.median_cpu:.2f}x, "
            f"wall {sample.median_wall / base.median_wall:.2f}x"
        )
    deps = samples["file_dependencies"].median_cpu / samples["file_deps reference"].median_cpu
    print(f"file_dependencies vs file_deps reference: CPU {deps:.2f}x")
    same = sum(1 for t in texts if python_imports(t) == reference(t))
    print(f"same imports as reference: python_imports {same} of {len(texts)} files")
    del live


if __name__ == "__main__":
    main()

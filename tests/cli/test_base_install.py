"""The base install (``pip install longctx``, no extra) imports every module of the product and runs
``longctx --help`` and each subcommand's ``--help``: every package a module imports when it is
imported, directly or through a library, is declared in pyproject.toml's ``dependencies`` (or by one
of those, recursively), and what an extra brings is imported inside the function that needs it.

The test's environment holds the test extra too (transformers, for one, brings ``regex``, which
datatrove imports but declares only in an extra of its own), so the base install is reconstructed
from the installed metadata: the distributions in the closure of longctx's requirements (markers
evaluated without an extra, a requirement's own extras followed), and the top-level modules they
install. A subprocess imports with an import system that finds no other module, as if nothing else
were installed. `make demo`, which `.ci/run` runs in a fresh virtual environment before the suite,
checks the same at run time.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]

_BASE_ONLY = """
import importlib.machinery, importlib.metadata, json, re, site, sys

modules, distributions = (json.loads(arg) for arg in sys.argv[1:3])
del sys.argv[1:3]
site_packages = tuple(site.getsitepackages())


def base_name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


class BaseInstallOnly:
    # sys.meta_path's path finder, blind to what site-packages holds beyond the base install: `import
    # x` raises ModuleNotFoundError, importlib.util.find_spec("x") is None and importlib.metadata
    # finds no distribution, as when x is not installed (the standard library is found as usual)
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        spec = self.finder.find_spec(name, path, target)
        top = name.partition(".")[0]
        where = [spec.origin or "", *(spec.submodule_search_locations or [])] if spec else []
        if spec and top not in modules and any(w.startswith(site_packages) for w in where):
            return None
        return spec

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        found = self.finder.find_distributions(context)
        return (d for d in found if base_name(d.metadata["Name"]) in distributions)

    def invalidate_caches(self):
        self.finder.invalidate_caches()


sys.meta_path[:] = [
    BaseInstallOnly(f) if f is importlib.machinery.PathFinder else f for f in sys.meta_path
]
"""
"""Run first: the interpreter's import system blinded to what is not in the base install (its
arguments: the base install's top-level modules and distributions, as JSON, removed from ``sys.argv``)."""

_WALK = """
import contextlib, importlib, importlib.util, io, pkgutil, traceback

packages = json.loads(sys.argv[1])
failures, imported = {}, []


def walk(name):
    try:
        module = importlib.import_module(name)
    except Exception:
        failures[name] = traceback.format_exc().strip().splitlines()[-1]
        return
    imported.append(name)
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if f"{name}.{info.name}" not in packages:
            walk(f"{name}.{info.name}")


for package in packages:
    walk(package)
from longctx.cli import COMMANDS, main

for argv in ([], *([name] for name in COMMANDS)):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main([*argv, "--help"])
    except SystemExit as exit:
        if exit.code != 0:
            failures[" ".join(["longctx", *argv, "--help"])] = f"exit status {exit.code}"
    except Exception:
        failures[" ".join(["longctx", *argv, "--help"])] = traceback.format_exc().strip().splitlines()[-1]
# the import system is blind to the test extra, which this interpreter has installed
blind = importlib.util.find_spec("pytest") is None and "pytest" not in {
    base_name(d.metadata["Name"]) for d in importlib.metadata.distributions()
}
print(json.dumps({"failures": failures, "imported": imported, "blind": blind}))
"""


def base_distributions(leave_out: frozenset[str] = frozenset()) -> set[str]:
    """The (normalized) names of the distributions ``pip install longctx`` brings, from the installed
    metadata: longctx's requirements that hold without an extra, theirs, and so on (``pkg[x]`` brings
    the requirements of pkg's extra ``x`` too). ``leave_out``: requirements to ignore, as if undeclared."""
    found: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("longctx", frozenset())]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in done:
            continue
        done.add((canonicalize_name(name), extras))
        found.add(canonicalize_name(name))
        environments = [{"extra": ""}, *({"extra": extra} for extra in extras)]
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) in leave_out:
                continue
            if requirement.marker is None or any(requirement.marker.evaluate(e) for e in environments):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def top_level_modules(distributions: set[str]) -> set[str]:
    """The top-level modules (and packages) the installed ``distributions`` provide."""
    return {
        module
        for module, providers in importlib.metadata.packages_distributions().items()
        if any(canonicalize_name(p) in distributions for p in providers)
    }


def base_only(code: str, *args: str, cwd: Path, leave_out: frozenset[str] = frozenset()):
    """Run ``code`` with ``args`` in a Python that sees the base install only (less ``leave_out``)."""
    distributions = base_distributions(leave_out)
    modules = sorted(top_level_modules(distributions) | {"longctx"})
    blind = [json.dumps(modules), json.dumps(sorted(distributions))]
    return subprocess.run(
        [sys.executable, "-c", _BASE_ONLY + code, *blind, *args],
        cwd=cwd,  # not the checkout's root, whose folders would be found as top-level modules
        capture_output=True,
        text=True,
        timeout=600,
    )


def _walk(cwd: Path, leave_out: frozenset[str] = frozenset()) -> dict:
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    done = base_only(_WALK, json.dumps(packages), cwd=cwd, leave_out=leave_out)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_base_install_imports_every_module_and_runs_each_help(tmp_path: Path) -> None:
    result = _walk(tmp_path)
    assert result["failures"] == {}
    # every module of every package pyproject.toml lists: the walk reached them all
    product = [
        p
        for folder in ("core", "pipeline", "packer", "trainer", "longctx")
        for p in (REPO / folder).rglob("*.py")
    ]
    assert len(result["imported"]) == len(product)
    assert result["blind"]


def test_an_undeclared_need_fails_the_check(tmp_path: Path) -> None:
    """The reference: the closure without ``regex`` (which datatrove's text utilities import and
    declare only in datatrove's ``processing`` extra) refuses every module that imports datatrove's
    deduplication, as a fresh ``pip install`` without that declaration did."""
    assert "regex" in base_distributions()
    result = _walk(tmp_path, leave_out=frozenset({"regex"}))
    assert result["failures"]["longctx.pipeline.curate"] == "ModuleNotFoundError: No module named 'regex'"


def test_a_source_an_extra_reads_is_refused_in_one_line_without_it(tmp_path: Path) -> None:
    """``kind: hf_dataset`` reads through datatrove's reader of the ``datasets`` package, which the
    base install lacks: one line naming the key and the extra, exit status 2, nothing written (it was
    datatrove's ImportError, a traceback, and a partial output folder)."""
    from longctx.pipeline.bpe import train_bpe

    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "state.json").write_text("{}")  # a datasets.save_to_disk folder, as far as the reader looks
    train_bpe(["some words to learn a tokenizer from"] * 20, 300, tmp_path / "tokenizer.json")
    config = {
        "output": str(tmp_path / "run"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tmp_path / "tokenizer.json")},
        "curate": {"sources": [{"name": "rows", "kind": "hf_dataset", "path": str(dataset)}]},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    cli = "import sys\nfrom longctx.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    done = base_only(cli, "curate", "--config", str(tmp_path / "run.yaml"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "  curate.sources.0.kind: needs the datasets package, which is not installed: "
        "pip install 'longctx[datasets]'"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()

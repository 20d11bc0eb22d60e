"""What gets installed: one top-level name, ``longctx``; each module importable under one name; a
trainer that imports without datatrove (a GPU machine that only trains need not install it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_NO_DATATROVE = """
import importlib.abc, importlib.util, pkgutil, sys

class NoDatatrove(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "datatrove" or name.startswith("datatrove."):
            raise ImportError(f"datatrove is not installed here (imported: {name})")
        return None

sys.meta_path.insert(0, NoDatatrove())
import longctx.trainer
# the trainer's modules and sub-packages, the dataloader, and what evaluation reads of the pipeline
names = [
    "longctx.packer.dataset",
    "longctx.packer.loader",
    "longctx.packer.reader",
    "longctx.pipeline.documents",
    "longctx.pipeline.synthetic.tasks",
]
names += [m.name for m in pkgutil.walk_packages(longctx.trainer.__path__, "longctx.trainer.")]
for name in names:
    importlib.import_module(name)
assert not any(m == "datatrove" or m.startswith("datatrove.") for m in sys.modules)
print(len(names))
"""

_ALL_MODULES = """
import importlib, json, pkgutil, sys
import longctx

def walk(package):
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if info.ispkg:
            walk(module)

for package in ("longctx", "longctx.pipeline", "longctx.packer", "longctx.trainer"):
    walk(importlib.import_module(package))
roots = tuple(sys.argv[1:])
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and path.startswith(roots):
        files.setdefault(path, []).append(name)
print(json.dumps(files))
"""


def _python(
    code: str, *args: str, cwd: Path, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()
) -> str:
    done = subprocess.run(
        [sys.executable, *flags, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_trainer_imports_without_datatrove(tmp_path: Path) -> None:
    imported = int(_python(_NO_DATATROVE, cwd=tmp_path))
    # every module and subpackage of the trainer, the dataloader, and what evaluation reads
    modules = [p for p in (REPO / "trainer").rglob("*.py") if p != REPO / "trainer" / "__init__.py"]
    assert imported == len(modules) + 5


@pytest.mark.parametrize("where", ["repo", "elsewhere"])
def test_every_module_has_one_name(where: str, tmp_path: Path) -> None:
    """Importing every module of longctx loads each file once, under its longctx name, and never
    under the old top-level names (from the repository root, where those folders sit, too)."""
    cwd = REPO if where == "repo" else tmp_path
    roots = [f"{REPO / folder}{os.sep}" for folder in ("longctx", "pipeline", "packer", "trainer")]
    files = json.loads(_python(_ALL_MODULES, *roots, cwd=cwd))
    assert len(files) > 80
    assert {path: names for path, names in files.items() if len(names) > 1} == {}
    assert all(names[0].split(".")[0] == "longctx" for names in files.values())


@pytest.mark.slow
def test_wheel_installs_only_longctx(tmp_path: Path) -> None:
    """A built wheel holds ``longctx/`` and its metadata only, with the console script and the format
    spec; installed, the three parts import from any folder and no generic top-level name exists."""
    # built from a copy, since setuptools leaves a build/ folder in the tree it builds
    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".*", "build", "dist", "runs", "*.egg-info", "__pycache__")
    shutil.copytree(REPO, source, ignore=skip)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("longctx-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {n.split("/")[0] for n in names} == {"longctx", wheel.name.split("-py")[0] + ".dist-info"}
    assert {
        "longctx/packer/FORMAT.md",
        "longctx/trainer/attention/ring.py",
        "longctx/core/atomic.py",
        "longctx/configs/demo.yaml",
    } <= set(names)
    assert "longctx = longctx.cli:main" in entry_points

    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)  # what `pip install` puts in site-packages
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = (
        "import importlib.util, json\n"
        "import longctx.core, longctx.core.errors, longctx.packer, longctx.pipeline, longctx.trainer\n"
        "parts = [m.__file__ for m in (longctx.core, longctx.packer, longctx.pipeline, longctx.trainer)]\n"
        "generic = [n for n in ('core', 'pipeline', 'packer', 'trainer') if importlib.util.find_spec(n)]\n"
        "import importlib.resources\n"
        "demo = importlib.resources.files('longctx') / 'configs' / 'demo.yaml'\n"  # what `longctx demo` reads
        "print(json.dumps({'parts': parts, 'generic': generic, 'demo': str(demo), "
        "'demo_text': demo.read_text()}))\n"
    )
    # -S: no site-packages, so the checkout's editable install is out of the picture (the parts'
    # package modules import nothing beyond the standard library)
    elsewhere = json.loads(_python(probe, cwd=tmp_path, env=env, flags=("-S",)))
    assert all(path.startswith(str(target / "longctx")) for path in elsewhere["parts"])
    assert elsewhere["generic"] == []
    # the demo's config comes with the package, equal to the repository's configs/demo.yaml
    assert elsewhere["demo"].startswith(str(target / "longctx"))
    assert elsewhere["demo_text"] == (REPO / "configs" / "demo.yaml").read_text()
    # from the repository root, whose longctx/ folder holds the roof only, the parts still come from
    # the installed package
    at_root = json.loads(_python(probe, cwd=REPO, env=env, flags=("-S",)))
    assert all(path.startswith(str(target / "longctx")) for path in at_root["parts"])

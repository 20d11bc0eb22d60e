"""Which repository is a code file's upstream: manifests read without running anything, imports
rewritten under a vendor prefix, the import root; on repositories built in the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.pipeline.provenance import (
    AT_IMPORT_ROOT,
    DECLARED,
    ELSEWHERE,
    REWRITTEN,
    declarations,
    manifest_name,
    provenance,
    rewritten_imports,
)
from longctx.pipeline.readers.listing import Tree


def repository(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return Tree.of(str(root))


@pytest.mark.parametrize(
    ("filename", "text", "name"),
    [
        ("pyproject.toml", '[project]\nname = "requests"\n', "requests"),
        ("pyproject.toml", '[tool.poetry]\nname = "Foo-Bar"\n', "Foo-Bar"),
        ("pyproject.toml", "[build-system]\nrequires = []\n", None),
        ("pyproject.toml", "[project\nname = broken", None),
        ("setup.cfg", "[metadata]\nname = attrs\nversion = 1\n", "attrs"),
        ("setup.py", "from setuptools import setup\nsetup(name='six', version='1.0')\n", "six"),
        ("setup.py", 'import setuptools\nsetuptools.setup(\n    name="idna",\n)\n', "idna"),
        ("setup.py", "NAME = 'x'\nsetup(name=NAME)\n", None),  # computed: declares nothing
        ("setup.py", "def broken(:\n", None),
        ("go.mod", "module github.com/pkg/errors\n\ngo 1.21\n", "github.com/pkg/errors"),
        ("Cargo.toml", '[package]\nname = "serde"\nversion = "1.0.0"\n', "serde"),
    ],
)
def test_manifests_name_their_package(filename: str, text: str, name: str | None) -> None:
    assert manifest_name(filename, text) == name


def test_setup_py_is_read_never_run(tmp_path: Path) -> None:
    """A setup.py whose name is computed by code it would run declares nothing, and nothing runs."""
    pwned = tmp_path / "PWNED"
    tree = repository(
        tmp_path / "repo",
        {
            "setup.py": f"open({str(pwned)!r}, 'w').write('ran')\nfrom setuptools import setup\n"
            f"setup(name=open({str(pwned)!r}).read())\n",
            "pkg/__init__.py": "",
        },
    )
    assert declarations(tree) == [] and not pwned.exists()


def test_levels_of_upstream_copies_and_rewritten_copies(tmp_path: Path) -> None:
    upstream = repository(
        tmp_path / "requests",
        {
            "pyproject.toml": '[project]\nname = "requests"\n',
            "src/requests/__init__.py": "import urllib3\n",
            "src/requests/api.py": "from . import sessions\n",
            "docs/conf.py": "project = 'requests'\n",
            "src/requests/_vendor/idna/core.py": "x = 1\n",  # another project's, inside this one
        },
    )
    found = declarations(upstream)
    level = {rel: provenance(rel, (tmp_path / "requests" / rel).read_text(), upstream, found) for rel in [
        "src/requests/__init__.py", "src/requests/api.py", "docs/conf.py", "src/requests/_vendor/idna/core.py"
    ]}  # fmt: skip
    assert level == {
        "src/requests/__init__.py": DECLARED,
        "src/requests/api.py": DECLARED,
        "docs/conf.py": ELSEWHERE,  # not in the declared package, and docs/ is not a package
        "src/requests/_vendor/idna/core.py": ELSEWHERE,
    }
    copy = repository(
        tmp_path / "copy",
        {
            "requests/__init__.py": "from pip._vendor import urllib3\n",
            "requests/api.py": "from . import sessions\n",
            "loose/helper.py": "x = 1\n",  # a folder without __init__.py: not at the import root
        },
    )
    level = {rel: provenance(rel, (tmp_path / "copy" / rel).read_text(), copy, []) for rel in [
        "requests/__init__.py", "requests/api.py", "loose/helper.py"
    ]}  # fmt: skip
    assert level == {
        "requests/__init__.py": REWRITTEN,
        "requests/api.py": AT_IMPORT_ROOT,
        "loose/helper.py": ELSEWHERE,
    }


def test_a_go_module_and_a_crate_declare_every_file_below_them(tmp_path: Path) -> None:
    tree = repository(
        tmp_path / "mono",
        {
            "errors/go.mod": "module github.com/pkg/errors\n",
            "errors/errors.go": 'package errors\n\nimport "fmt"\n',
            "errors/vendor/golang.org/x/sys/unix.go": "package unix\n",
            "serde/Cargo.toml": '[package]\nname = "serde"\n',
            "serde/src/lib.rs": "pub mod de;\n",
            "tools/main.go": "package main\n",
        },
    )
    found = declarations(tree)
    assert provenance("errors/errors.go", "", tree, found) == DECLARED
    assert provenance("serde/src/lib.rs", "", tree, found) == DECLARED
    assert provenance("errors/vendor/golang.org/x/sys/unix.go", "", tree, found) == ELSEWHERE
    assert provenance("tools/main.go", "", tree, found) == AT_IMPORT_ROOT


@pytest.mark.parametrize(
    ("rel", "text", "rewritten"),
    [
        ("a.py", "from pip._vendor.urllib3.util import retry\n", True),
        ("a.py", "import pip._vendor.chardet as chardet\n", True),
        ("a.py", "from .._vendor import six\n", True),
        ("a.py", "import os, setuptools.extern.packaging\n", True),
        ("a.py", "import urllib3\nfrom . import api\n", False),
        ("a.py", "# see vendor/ for the copies\nx = 'third_party'\n", False),
        ("main.go", 'import (\n\t"fmt"\n\tx "example.com/app/vendor/golang.org/x/net"\n)\n', True),
        ("main.go", 'import "github.com/pkg/errors"\n', False),
        ("lib.cc", '#include "third_party/absl/strings/str_cat.h"\n', True),
        ("lib.cc", '#include <vector>\n#include "lib.h"\n', False),
        ("app.ts", "import { x } from './vendor/lodash';\n", True),
        ("app.js", "const x = require('../third_party/left-pad');\n", True),
        ("app.js", "import x from 'react';\n", False),
        ("README.md", "import pip._vendor.x\n", False),  # not source code
    ],
)
def test_imports_rewritten_under_a_vendor_prefix(rel: str, text: str, rewritten: bool) -> None:
    assert rewritten_imports(rel, text) is rewritten

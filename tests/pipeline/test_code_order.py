"""Tests for longctx.pipeline.readers.code_order: import extraction per language, resolution, and ordering.

Everything here is pure: repositories are ``{relative path: text}`` dicts, graphs are dicts.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.pipeline.readers.code_order import (
    PythonImport,
    RustMod,
    c_includes,
    file_dependencies,
    go_imports,
    go_module_path,
    js_imports,
    order_files,
    python_imports,
    rust_crate_uses,
    rust_mods,
    strongly_connected_components,
)

# ----------------------------------------------------------------------------------------- extraction


def test_python_imports_forms() -> None:
    source = "import a.b, c as d\nfrom .x import y, z\nfrom .. import w\nfrom e.f import *\n"
    assert python_imports(source) == [
        PythonImport("a.b", 0, ()),
        PythonImport("c", 0, ()),
        PythonImport("x", 1, ("y", "z")),
        PythonImport("", 2, ("w",)),
        PythonImport("e.f", 0, ("*",)),
    ]


def test_python_imports_only_load_time() -> None:
    source = """
import top
try:
    import in_try
except ImportError:
    import in_except
if TYPE_CHECKING:
    import typing_only
else:
    import typing_else
if typing.TYPE_CHECKING:
    import typing_only_2
class K:
    import in_class
def f():
    import in_function
async def g():
    import in_async_function
"""
    modules = {imp.module for imp in python_imports(source)}
    assert modules == {"top", "in_try", "in_except", "typing_else", "in_class"}


def test_python_imports_unparsable_source_has_none() -> None:
    assert python_imports("print 'python 2'\nimport os\n") == []
    assert python_imports("def (:\n") == []
    assert python_imports("import os\ndef f(a, (b, c)):\n    pass\n") == []  # a Python 2 header
    assert python_imports("import os\nclass K:\n    x = (\n") == []
    # A SyntaxWarning (invalid escape) must not escape either.
    assert python_imports('import re\nPATTERN = "\\d"\n') == [PythonImport("re", 0, ())]


def test_c_includes() -> None:
    source = '#include "a.h"\n  #  include <b/c.h>\n#import "d.h"\n// #include "not_at_line_start.h" x\n'
    assert c_includes(source) == [("a.h", True), ("b/c.h", False), ("d.h", True)]


def test_js_imports_all_forms() -> None:
    source = """
import x from './a';
import { y } from "../b/c";
import './side-effect';
export * from './re';
export { z } from './re2.js';
const c = require('./req');
const lazy = import('./dyn');
import React from 'react';
const fs = require("fs");
"""
    assert js_imports(source) == [
        "./a",
        "../b/c",
        "./side-effect",
        "./re",
        "./re2.js",
        "./req",
        "./dyn",
    ]


def test_go_imports_and_module() -> None:
    source = (
        'package main\n\nimport "fmt"\nimport alias "ex.com/m/a"\n\n'
        'import (\n  "os"\n  b "ex.com/m/b" // c\n  _ `ex.com/m/c`\n)\n'
    )
    assert go_imports(source) == ["fmt", "ex.com/m/a", "os", "ex.com/m/b", "ex.com/m/c"]
    assert go_module_path("// comment\nmodule example.com/proj\n\ngo 1.21\n") == "example.com/proj"
    assert go_module_path('module "quoted.org/x"\n') == "quoted.org/x"
    assert go_module_path("go 1.21\n") is None


def test_rust_mods_and_uses() -> None:
    source = """
pub mod net;
mod util;
pub(crate) mod r#async;
#[cfg(test)]
#[path = "testing/helpers.rs"]
mod helpers;
mod inline { fn f() {} }
// mod commented;
use crate::util::{helper, nested::{deep as d, other}};
use crate::net::Conn;
use std::io;
"""
    assert rust_mods(source) == [
        RustMod("net"),
        RustMod("util"),
        RustMod("async"),
        RustMod("helpers", "testing/helpers.rs"),
    ]
    assert rust_crate_uses(source) == [
        ["util", "helper"],
        ["util", "nested", "deep"],
        ["util", "nested", "other"],
        ["net", "Conn"],
    ]


# ----------------------------------------------------------------------------------------- resolution


def test_python_resolution_absolute_relative_and_packages() -> None:
    files = {
        "pkg/__init__.py": "from .core import run\nfrom . import util\n",
        "pkg/core.py": "from pkg.util import helper\nimport pkg.models.base\nimport os\n",
        "pkg/util.py": "import os\n",
        "pkg/models/__init__.py": "from .base import Model\n",
        "pkg/models/base.py": "from ..util import helper\nfrom ... import beyond_root\n",
        "app.py": "import pkg\nfrom pkg.models import Model\nfrom pkg import core, util\n",
    }
    assert file_dependencies(files, "repo") == {
        "pkg/__init__.py": {"pkg/core.py", "pkg/util.py"},
        "pkg/core.py": {"pkg/util.py", "pkg/models/base.py"},
        "pkg/util.py": set(),
        "pkg/models/__init__.py": {"pkg/models/base.py"},
        "pkg/models/base.py": {"pkg/util.py"},
        "app.py": {"pkg/__init__.py", "pkg/models/__init__.py", "pkg/core.py", "pkg/util.py"},
    }


def test_python_resolution_repo_is_the_package() -> None:
    # A copy of a package as the repository folder: ``from json import scanner`` names ./scanner.py.
    files = {
        "__init__.py": "from .decoder import D\n",
        "decoder.py": "from json import scanner\n",
        "scanner.py": "x = 1\n",
    }
    deps = file_dependencies(files, "json")
    assert deps["decoder.py"] == {"scanner.py"}
    assert deps["__init__.py"] == {"decoder.py"}
    # Under another repository name the same import is an external one.
    assert file_dependencies(files, "other")["decoder.py"] == set()


def test_python_resolution_src_layout_scripts_and_nested_roots() -> None:
    files = {
        "src/lib/__init__.py": "from lib.a import f\n",
        "src/lib/a.py": "x = 1\n",
        "scripts/run.py": "import helper\nimport lib\n",
        "scripts/helper.py": "y = 2\n",
        "python/tool/__init__.py": "z = 3\n",
        "python/tool/cli.py": "w = 4\n",
        "bench.py": "from tool.cli import main\n",
    }
    deps = file_dependencies(files, "repo")
    assert deps["src/lib/__init__.py"] == {"src/lib/a.py"}
    assert deps["scripts/run.py"] == {"scripts/helper.py", "src/lib/__init__.py"}
    assert deps["bench.py"] == {"python/tool/cli.py"}


def test_c_resolution() -> None:
    files = {
        "include/lib/api.h": "int api(void);\n",
        "src/util.h": '#include "../include/lib/api.h"\n',
        "src/main.c": '#include "util.h"\n#include <lib/api.h>\n#include <stdio.h>\n#include "missing.h"\n',
        "src/impl/deep.c": '#include "lib/api.h"\n#include "util.h"\n',
    }
    deps = file_dependencies(files, "repo")
    assert deps["src/util.h"] == {"include/lib/api.h"}
    assert deps["src/main.c"] == {"src/util.h", "include/lib/api.h"}
    # "util.h" is not next to deep.c: found through the src/ include folder.
    assert deps["src/impl/deep.c"] == {"include/lib/api.h", "src/util.h"}


def test_js_resolution() -> None:
    files = {
        "src/index.ts": (
            "import { a } from './a';\nexport * from './b';\nimport './side';\nimport { d } from './d.js';\n"
        ),
        "src/a.ts": "const c = require('./c');\n",
        "src/b/index.js": "export const b = 1;\n",
        "src/c.js": "const lazy = import('./lazy.mjs');\nrequire('../../outside');\n",
        "src/lazy.mjs": "export default 1;\n",
        "src/side.tsx": "export {};\n",
        "src/d.ts": "export const d = 1;\n",
    }
    deps = file_dependencies(files, "repo")
    assert deps["src/index.ts"] == {"src/a.ts", "src/b/index.js", "src/side.tsx", "src/d.ts"}
    assert deps["src/a.ts"] == {"src/c.js"}
    assert deps["src/c.js"] == {"src/lazy.mjs"}


def test_go_resolution() -> None:
    files = {
        "go.mod": "module example.com/proj\n\ngo 1.21\n",
        "main.go": 'package main\nimport (\n "fmt"\n "example.com/proj/internal/store"\n)\n',
        "internal/store/store.go": 'package store\nimport "example.com/proj/pkg/util"\n',
        "internal/store/extra.go": "package store\n",
        "internal/store/store_test.go": 'package store\nimport "example.com/proj/pkg/util"\n',
        "pkg/util/util.go": "package util\n",
        "pkg/util/util_test.go": 'package util_test\nimport "example.com/proj/internal/store"\n',
    }
    deps = file_dependencies(files, "repo")
    assert deps["main.go"] == {"internal/store/store.go", "internal/store/extra.go"}
    assert deps["internal/store/store.go"] == {"pkg/util/util.go"}
    # Test files depend on what they import, but nothing depends on a test file.
    assert deps["pkg/util/util_test.go"] == {"internal/store/store.go", "internal/store/extra.go"}
    assert not any("_test.go" in dep for dep_set in deps.values() for dep in dep_set)


def test_rust_resolution_2018_rule_path_attribute_and_crate_uses() -> None:
    files = {
        "src/lib.rs": 'pub mod net;\nmod util;\n#[path = "special/x.rs"]\nmod x;\n',
        "src/net.rs": "mod tcp;\n",
        "src/net/tcp.rs": "use crate::util::helper;\n",
        "src/util/mod.rs": "mod inner;\n",
        "src/util/inner.rs": "pub fn f() {}\n",
        "src/tcp.rs": "// a decoy: net.rs's tcp is src/net/tcp.rs\n",
        "src/special/x.rs": "use crate::Thing;\n",
    }
    deps = file_dependencies(files, "repo")
    assert deps["src/lib.rs"] == {"src/net.rs", "src/util/mod.rs", "src/special/x.rs"}
    assert deps["src/net.rs"] == {"src/net/tcp.rs"}
    assert deps["src/util/mod.rs"] == {"src/util/inner.rs"}
    assert deps["src/net/tcp.rs"] == {"src/util/mod.rs"}
    assert deps["src/special/x.rs"] == set()  # crate:: items of the crate root add no edge


def test_self_imports_are_ignored() -> None:
    files = {"pkg/__init__.py": "from . import x\nfrom pkg import *\n", "self.h": '#include "self.h"\n'}
    assert file_dependencies(files, "repo") == {"pkg/__init__.py": set(), "self.h": set()}


# ------------------------------------------------------------------------------------------- ordering


def _position(order: list[str]) -> dict[str, int]:
    return {node: i for i, node in enumerate(order)}


def test_order_respects_dependencies_and_path_order() -> None:
    deps = {"c": {"a"}, "b": set(), "a": set(), "d": {"c", "b"}}
    # Ready at first: a, b (by path); then c (needs a), then d.
    assert order_files(deps) == ["a", "b", "c", "d"]


def test_order_key_chooses_among_ready_files_only() -> None:
    deps = {"a": set(), "b": {"a"}, "c": set()}
    # The key prefers b, but b is not ready before a; once it is, it goes before c.
    assert order_files(deps, key=lambda p: (p != "b", p)) == ["a", "b", "c"]
    assert order_files(deps, key=lambda p: (p != "c", p)) == ["c", "a", "b"]


def test_order_ignores_self_and_unknown_dependencies() -> None:
    assert order_files({"a": {"a", "zzz"}, "b": {"a"}}) == ["a", "b"]


def test_cycle_breaking_follows_the_rule() -> None:
    # e is outside the cycle and comes first. Then the cycle {a, b, c} is stuck with unemitted
    # dependencies a: 2 (b, c), b: 1 (a), c: 1 (a): b has the fewest (tie with c broken by path).
    # After b: a: 1 (c), c: 1 (a) -> a by path; then c; then d, which needed c.
    deps = {"a": {"b", "c", "e"}, "b": {"a"}, "c": {"a"}, "d": {"c"}, "e": set()}
    assert order_files(deps) == ["e", "b", "a", "c", "d"]


def test_cycle_breaking_never_jumps_ahead_of_an_upstream_cycle() -> None:
    # Cycle {a1, a2} depends on cycle {y1, y2}. At the start nothing is ready and a2 has the fewest
    # unemitted dependencies with the smallest path, but the a-cycle is still blocked by y1, so the
    # choice is made in the y-cycle: y1 (tie with y2 by path), then y2 is ready, then a1 and a2.
    deps = {"y1": {"y2"}, "y2": {"y1"}, "a1": {"y1", "a2"}, "a2": {"a1"}}
    assert order_files(deps) == ["y1", "y2", "a1", "a2"]


def test_order_is_independent_of_insertion_order() -> None:
    rng = random.Random(7)
    nodes = [f"n{i:02d}" for i in range(30)]
    deps = {n: {m for m in nodes if rng.random() < 0.1} for n in nodes}
    expected = order_files(deps)
    for _ in range(5):
        shuffled_nodes = nodes[:]
        rng.shuffle(shuffled_nodes)
        shuffled = {n: list(deps[n])[::-1] for n in shuffled_nodes}
        assert order_files(shuffled) == expected


def _reachability(deps: dict[str, set[str]]) -> dict[str, set[str]]:
    """Transitive closure by Warshall's algorithm (independent of the implementation under test)."""
    reach = {n: set(d) & set(deps) for n, d in deps.items()}
    for k in deps:
        for i in deps:
            if k in reach[i]:
                reach[i] |= reach[k]
    return reach


@st.composite
def _graphs(draw: st.DrawFn) -> dict[str, set[str]]:
    n = draw(st.integers(min_value=0, max_value=12))
    nodes = [f"f{i}" for i in range(n)]
    edges = (
        draw(st.sets(st.tuples(st.sampled_from(nodes), st.sampled_from(nodes)), max_size=30))
        if nodes
        else set()
    )
    return {node: {dep for dependent, dep in edges if dependent == node} for node in nodes}


@settings(max_examples=300, deadline=None)
@given(_graphs())
def test_order_properties_on_random_graphs(deps: dict[str, set[str]]) -> None:
    order = order_files(deps)
    assert sorted(order) == sorted(deps)  # a permutation
    position = _position(order)
    reach = _reachability(deps)
    for node, node_deps in deps.items():
        for dep in node_deps - {node}:
            in_one_cycle = node in reach[dep] and dep in reach[node]
            if not in_one_cycle:
                assert position[dep] < position[node], (dep, node)
    # A cycle is only broken when no file is ready.
    emitted: set[str] = set()
    for node in order:
        if deps[node] - {node} - emitted:
            remaining = [n for n in deps if n not in emitted]
            assert all(deps[n] - {n} - emitted for n in remaining)
        emitted.add(node)
    assert order_files(deps) == order


@settings(max_examples=100, deadline=None)
@given(_graphs())
def test_components_match_mutual_reachability(deps: dict[str, set[str]]) -> None:
    component = strongly_connected_components(deps)
    reach = _reachability(deps)
    for a, b in itertools.product(deps, deps):
        mutual = a == b or (a in reach[b] and b in reach[a])
        assert (component[a] == component[b]) == mutual


def test_order_scales_to_large_cyclic_graphs() -> None:
    n = 20_000
    nodes = [f"m{i:05d}" for i in range(n)]
    rng = random.Random(0)
    # One big cycle plus random extra edges: every step after the first is a tie-breaking decision.
    deps = {node: {nodes[(i + 1) % n], nodes[rng.randrange(n)]} for i, node in enumerate(nodes)}
    order = order_files(deps)
    assert len(order) == n and set(order) == set(nodes)

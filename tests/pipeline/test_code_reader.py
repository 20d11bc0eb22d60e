"""Tests for longctx.pipeline.readers.code: repositories on disk read as one document each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from datatrove.data import Document

from longctx.pipeline.readers.code import (
    DATA_FILE_MAX_BYTES,
    FILE_HEADER,
    FILE_SEPARATOR,
    CodeRepoReader,
    build_repo_text,
)
from longctx.pipeline.readers.listing import Tree

REPO_ROOT = Path(__file__).resolve().parents[2]


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def read_one(repo: Path, **kwargs) -> Document:
    """Run the reader on the folder holding ``repo`` and return ``repo``'s document."""
    docs = list(CodeRepoReader(repo.parent, **kwargs).run(rank=0, world_size=1))
    return next(doc for doc in docs if doc.id == f"code/{repo.name}")


def offsets(doc: Document) -> dict[str, int]:
    return {entry["path"]: entry["offset"] for entry in doc.metadata["files"]}


def skipped(doc: Document) -> dict[str, str]:
    return {entry["path"]: entry["reason"] for entry in doc.metadata["skipped_files"]}


def assert_before(doc: Document, edges: list[tuple[str, str]]) -> None:
    """Each ``(dependency, dependent)`` pair: the dependency's span starts before the dependent's."""
    where = offsets(doc)
    for dependency, dependent in edges:
        assert where[dependency] < where[dependent], f"{dependency} should come before {dependent}"


# ------------------------------------------------------------------------------------ per language


def make_python_repo(root: Path) -> Path:
    repo = root / "pyrepo"
    write(repo, "README.md", "# pyrepo\n\nA test repository.\n")
    write(repo, "pkg/__init__.py", "from .core import run\nfrom . import util\n")
    write(
        repo,
        "pkg/core.py",
        "from pkg.util import helper\nimport pkg.models.base\n\ndef run():\n    return helper()\n",
    )
    write(repo, "pkg/util.py", "import os\n\ndef helper():\n    return os.sep\n")
    write(repo, "pkg/models/__init__.py", "from .base import Model\n")
    write(repo, "pkg/models/base.py", "from ..util import helper\n\nclass Model:\n    pass\n")
    write(repo, "app.py", "import pkg\nfrom pkg.models import Model\n")
    return repo


PYTHON_EDGES = [
    ("pkg/util.py", "pkg/core.py"),
    ("pkg/models/base.py", "pkg/core.py"),
    ("pkg/util.py", "pkg/models/base.py"),
    ("pkg/core.py", "pkg/__init__.py"),
    ("pkg/util.py", "pkg/__init__.py"),
    ("pkg/models/base.py", "pkg/models/__init__.py"),
    ("pkg/__init__.py", "app.py"),
    ("pkg/models/__init__.py", "app.py"),
]


def test_python_repo_dependency_order(tmp_path: Path) -> None:
    doc = read_one(make_python_repo(tmp_path))
    assert_before(doc, PYTHON_EDGES)
    assert doc.metadata["files"][0]["path"] == "README.md"  # the top-level README comes first
    assert doc.metadata["n_files"] == 7
    assert doc.metadata["n_import_edges"] == len(PYTHON_EDGES)


def test_c_repo_dependency_order(tmp_path: Path) -> None:
    repo = tmp_path / "crepo"
    write(repo, "include/lib/api.h", "#pragma once\nint api(void);\n")
    write(repo, "src/util.h", '#include "../include/lib/api.h"\nint util(void);\n')
    write(
        repo,
        "src/main.c",
        '#include <stdio.h>\n#include <lib/api.h>\n#include "util.h"\nint main(void) { return 0; }\n',
    )
    write(repo, "src/api.c", '#include "lib/api.h"\nint api(void) { return 1; }\n')
    write(repo, "Makefile", "all:\n\tcc src/*.c\n")
    doc = read_one(repo)
    assert_before(
        doc,
        [
            ("include/lib/api.h", "src/util.h"),
            ("src/util.h", "src/main.c"),
            ("include/lib/api.h", "src/main.c"),
            ("include/lib/api.h", "src/api.c"),
        ],
    )
    assert "Makefile" in offsets(doc)


def test_js_ts_repo_dependency_order(tmp_path: Path) -> None:
    repo = tmp_path / "jsrepo"
    write(repo, "package.json", '{"name": "jsrepo", "main": "src/index.ts"}\n')
    write(
        repo,
        "src/index.ts",
        "import { a } from './a';\nexport * from './b';\nimport './side';\nimport { d } from './d.js';\n",
    )
    write(repo, "src/a.ts", "const c = require('./c');\nexport const a = c;\n")
    write(repo, "src/b/index.js", "export const b = 1;\n")
    write(repo, "src/c.js", "module.exports = import('./lazy.mjs');\n")
    write(repo, "src/lazy.mjs", "export default 1;\n")
    write(repo, "src/side.tsx", "export {};\n")
    write(repo, "src/d.ts", "export const d = 1;\n")
    doc = read_one(repo)
    assert_before(
        doc,
        [
            ("src/a.ts", "src/index.ts"),
            ("src/b/index.js", "src/index.ts"),
            ("src/side.tsx", "src/index.ts"),
            ("src/d.ts", "src/index.ts"),
            ("src/c.js", "src/a.ts"),
            ("src/lazy.mjs", "src/c.js"),
        ],
    )


def test_go_repo_dependency_order(tmp_path: Path) -> None:
    repo = tmp_path / "gorepo"
    write(repo, "go.mod", "module example.com/proj\n\ngo 1.21\n")
    write(repo, "go.sum", "example.com/x v1.0.0 h1:abc=\n")
    write(repo, "main.go", 'package main\n\nimport (\n\t"fmt"\n\t"example.com/proj/internal/store"\n)\n')
    write(repo, "internal/store/store.go", 'package store\n\nimport "example.com/proj/pkg/util"\n')
    write(repo, "internal/store/extra.go", "package store\n\nfunc Extra() {}\n")
    write(repo, "pkg/util/util.go", "package util\n\nfunc U() {}\n")
    doc = read_one(repo)
    assert_before(
        doc,
        [
            ("pkg/util/util.go", "internal/store/store.go"),
            ("internal/store/store.go", "main.go"),
            ("internal/store/extra.go", "main.go"),
        ],
    )
    assert skipped(doc)["go.sum"] == "lock_file"


def test_rust_repo_dependency_order(tmp_path: Path) -> None:
    repo = tmp_path / "rsrepo"
    write(repo, "Cargo.toml", '[package]\nname = "rsrepo"\nversion = "0.1.0"\n')
    write(repo, "Cargo.lock", "# generated\nversion = 3\n")
    write(repo, "src/lib.rs", "pub mod net;\nmod util;\n")
    write(repo, "src/net.rs", "mod tcp;\npub use tcp::Conn;\n")
    write(repo, "src/net/tcp.rs", "use crate::util::helper;\npub struct Conn;\n")
    write(repo, "src/util/mod.rs", "pub fn helper() {}\n")
    write(repo, "src/a_unrelated.rs", "// sorts first by path, depends on nothing\n")
    doc = read_one(repo)
    assert_before(
        doc,
        [
            ("src/net.rs", "src/lib.rs"),
            ("src/util/mod.rs", "src/lib.rs"),
            ("src/net/tcp.rs", "src/net.rs"),
            ("src/util/mod.rs", "src/net/tcp.rs"),
        ],
    )
    assert skipped(doc)["Cargo.lock"] == "lock_file"


def test_cycle_is_broken_by_fewest_unemitted_dependencies(tmp_path: Path) -> None:
    repo = tmp_path / "cyclic"
    # a imports b, c, e; b and c import a; d imports c. e is ready first; then the cycle {a, b, c}
    # has unemitted dependencies a: 2, b: 1, c: 1, so b goes (tie with c broken by path), then a
    # and c tie at 1 -> a, then c, then d.
    write(repo, "a.py", "import b, c, e\n")
    write(repo, "b.py", "import a\n")
    write(repo, "c.py", "import a\n")
    write(repo, "d.py", "import c\n")
    write(repo, "e.py", "X = 1\n")
    doc = read_one(repo)
    assert [entry["path"] for entry in doc.metadata["files"]] == ["e.py", "b.py", "a.py", "c.py", "d.py"]


# ------------------------------------------------------------------------------------ text layout


def test_offsets_are_precise_and_cover_the_text(tmp_path: Path) -> None:
    repo = make_python_repo(tmp_path)
    write(repo, "no_trailing_newline.py", "x = 1")
    write(repo, "crlf.py", "a = 1\r\nb = 2\r\n")
    write(repo, "unicode.md", "Ünïcödé — 日本語 🎉\n")
    doc = read_one(repo)
    text = doc.text
    rebuilt = []
    for entry in doc.metadata["files"]:
        block = text[entry["offset"] : entry["offset"] + entry["length"]]
        content = (repo / entry["path"]).read_text(encoding="utf-8").replace("\r\n", "\n")
        if not content.endswith("\n"):
            content += "\n"
        assert block == FILE_HEADER.format(path=entry["path"]) + content
        rebuilt.append(block)
    assert FILE_SEPARATOR.join(rebuilt) == text
    assert "\r" not in text


def test_build_repo_text_without_datatrove(tmp_path: Path) -> None:
    repo = make_python_repo(tmp_path)
    result = build_repo_text(Tree.of(str(repo)), max_file_bytes=10_000)
    assert result.text == read_one(repo).text
    assert result.files[0].path == "README.md"
    assert result.skipped == []


def test_deterministic_regardless_of_creation_order(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "z.py": "import a\n",
        "a.py": "import m\n",
        "m.py": "X = 1\n",
        "sub/b.py": "from sub import c\n",
        "sub/c.py": "Y = 2\n",
        "README.rst": "Title\n=====\n",
        "image.png": b"\x89PNG\r\n\x1a\n\x00\x00",
    }
    docs = []
    for variant, reverse in (("first", False), ("second", True)):
        repo = tmp_path / variant / "repo"
        for rel in sorted(files, reverse=reverse):
            write(repo, rel, files[rel])
        docs.append(read_one(repo))
        docs.append(read_one(repo))
    first = docs[0]
    for doc in docs[1:]:
        assert doc.text == first.text
        assert doc.metadata["files"] == first.metadata["files"]
        assert doc.metadata["skipped_files"] == first.metadata["skipped_files"]


def test_deterministic_across_hash_seeds(tmp_path: Path) -> None:
    repo = make_python_repo(tmp_path)
    write(repo, "cyc1.py", "import cyc2\nimport pkg\n")
    write(repo, "cyc2.py", "import cyc1\n")
    script = (
        "import json, sys\nfrom pathlib import Path\n"
        "from longctx.pipeline.readers.code import build_repo_text\n"
        "from longctx.pipeline.readers.listing import Tree\nr = build_repo_text(Tree.of(sys.argv[1]))\n"
        "print(json.dumps([r.text, [s.path for s in r.files]]))\n"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        result = subprocess.run(
            [sys.executable, "-c", script, str(repo)], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1


# ------------------------------------------------------------------------------------------ skips


def test_skips_with_reasons_and_nothing_leaks(tmp_path: Path) -> None:
    repo = tmp_path / "repos" / "mixed"
    write(repo, "main.py", "import helper\nprint(helper.X)\n")
    write(repo, "helper.py", "X = 'kept'\n")
    write(repo, "blob.py", b"LEAK_BINARY = 1\n\x00\x01\x02")
    write(repo, "latin1.py", "LEAK_LATIN1 = 'caf\xe9'\n".encode("latin-1"))
    write(repo, "big.py", "LEAK_BIG = 1\n" + "#" * 3 * DATA_FILE_MAX_BYTES + "\n")
    write(repo, "package-lock.json", '{"LEAK_LOCK": true}\n')
    write(repo, "yarn.lock", "LEAK_YARN\n")
    write(repo, "static/app.min.js", "var LEAK_MIN_NAME=1;\n")
    write(repo, "static/bundle.js", "var LEAK_MIN_CONTENT=1;" + "a=b+c;" * 1000 + "\n")
    write(repo, "proto/api_pb2.py", "LEAK_PB2 = 1\n")
    write(
        repo,
        "gen/types.go",
        "// Code generated by protoc-gen-go. DO NOT EDIT.\npackage gen // LEAK_GENERATED\n",
    )
    write(repo, "vendor/dep/dep.go", "package dep // KEPT_VENDORED: deduplicated per file, not skipped\n")
    write(repo, "node_modules/x/index.js", "// LEAK_NODE_MODULES\n")
    write(repo, "build/lib/out.py", "LEAK_BUILD = 1\n")
    write(repo, "pkg/build/__init__.py", "KEPT_BUILD_PACKAGE = 1\n")  # a package named build is source
    write(repo, "pkg/__pycache__/x.cpython-311.pyc", b"\x00LEAK_PYC")
    write(repo, ".env", "LEAK_SECRET=hunter2\n")
    write(repo, ".github/workflows/ci.yml", "# LEAK_HIDDEN_DIR\n")
    write(repo, "logo.png", b"\x89PNG LEAK_PNG")
    write(repo, "data.csv", "LEAK_CSV,1\n")
    write(repo, "data/large.json", '{"LEAK_DATA": [' + "1,\n" * (DATA_FILE_MAX_BYTES // 2) + "1]}\n")
    write(repo, "config.json", '{"small": "KEPT_JSON"}\n')
    write(repo, "pkg/empty/__init__.py", "")
    write(repo, "bad\nname.py", "LEAK_BAD_NAME = 1\n")
    os.mkfifo(repo / "pipe.py")  # reading it would block forever
    outside = tmp_path / "outside"
    write(outside, "secret.py", "LEAK_OUTSIDE_FILE = 1\n")
    write(outside, "dir/leak.py", "LEAK_OUTSIDE_DIR = 1\n")
    os.symlink(outside / "secret.py", repo / "link.py")
    os.symlink(outside / "dir", repo / "linked_dir")
    os.symlink(repo / "helper.py", repo / "alias.py")  # inside -> inside: skipped too
    os.symlink(tmp_path / "does-not-exist.py", repo / "dangling.py")

    doc = read_one(repo, max_file_bytes=2 * DATA_FILE_MAX_BYTES)
    assert "skip_reason" not in doc.metadata
    assert set(offsets(doc)) == {
        "main.py",
        "helper.py",
        "pkg/build/__init__.py",
        "config.json",
        "vendor/dep/dep.go",
    }
    assert "LEAK" not in doc.text
    assert "KEPT_BUILD_PACKAGE" in doc.text and "KEPT_JSON" in doc.text and "KEPT_VENDORED" in doc.text
    assert skipped(doc) == {
        "blob.py": "binary",
        "latin1.py": "not_utf8",
        "big.py": "too_large",
        "package-lock.json": "lock_file",
        "yarn.lock": "lock_file",
        "static/app.min.js": "minified",
        "static/bundle.js": "minified",
        "proto/api_pb2.py": "generated",
        "gen/types.go": "generated",
        "node_modules/": "dependency_tree",
        "build/": "build_output",
        "pkg/__pycache__/": "build_output",
        ".env": "hidden",
        ".github/": "hidden",
        "logo.png": "unsupported_extension",
        "data.csv": "unsupported_extension",
        "data/large.json": "large_data_file",
        "pkg/empty/__init__.py": "empty",
        "bad\\x0aname.py": "bad_filename",
        "pipe.py": "not_regular_file",
        "link.py": "symlink",
        "linked_dir/": "symlink",
        "alias.py": "symlink",
        "dangling.py": "symlink",
    }
    assert doc.metadata["n_skipped_files"] == len(doc.metadata["skipped_files"])
    assert doc.metadata["skipped_files"] == sorted(doc.metadata["skipped_files"], key=lambda e: e["path"])
    # every file under the repository is kept or accounted for by one skipped entry
    on_disk = sum(
        len(files) + sum(os.path.islink(os.path.join(d, x)) for x in dirs) for d, dirs, files in os.walk(repo)
    )
    accounted = doc.metadata["n_files"] + sum(e["files"] for e in doc.metadata["skipped_files"])
    assert accounted == on_disk == doc.metadata["input_files"]


def test_vendored_folders_can_be_skipped_whole(tmp_path: Path) -> None:
    repo = tmp_path / "repos" / "app"
    write(repo, "main.go", "package main\n")
    write(repo, "vendor/dep/dep.go", "package dep\n")
    write(repo, "third_party/lib/a.c", "int a;\n")
    write(repo, "third_party/lib/b.c", "int b;\n")
    doc = read_one(repo, vendored="skip")
    assert set(offsets(doc)) == {"main.go"}
    assert {e["path"]: (e["reason"], e["files"]) for e in doc.metadata["skipped_files"]} == {
        "third_party/": ("vendored", 2),
        "vendor/": ("vendored", 1),
    }
    assert set(offsets(read_one(repo))) == {
        "main.go",
        "vendor/dep/dep.go",
        "third_party/lib/a.c",
        "third_party/lib/b.c",
    }


def test_generated_files_are_found_by_conventional_markers_only(tmp_path: Path) -> None:
    repo = tmp_path / "gen"
    write(repo, "a.py", '"""Lexer.\n\nTokens generated by the lexer are kept here.\n"""\n')
    write(
        repo,
        "nodes.py",
        '"""AST nodes generated by the parser for the compiler. Also provides\n'
        'some node tree helper functions.\n"""\nclass Node:\n    pass\n',
    )
    write(repo, "notes.py", "# Helpers for the generated-code cache; generated by nobody.\nX = 1\n")
    write(repo, "b.py", "# @generated by tool\nX = 1\n")
    write(repo, "c.py", "\n" * 20 + "# Code generated by tool. DO NOT EDIT.\n")
    write(repo, "d.ts", "/* eslint-disable */\n// This file is auto-generated. Do not edit.\nexport {};\n")
    write(repo, "e.go", "// Code generated by mockgen. DO NOT EDIT.\npackage e\n")
    write(repo, "f.h", "/* DO NOT EDIT THIS FILE - it is machine generated */\n#include <jni.h>\n")
    write(repo, "g.py", "# Generated by Django 4.2 on 2024-01-01 12:00\nfrom django.db import migrations\n")
    write(repo, "h.c", "/* Generated by Cython 3.0.0 */\nint x;\n")
    write(
        repo,
        "i.py",
        "# -*- coding: utf-8 -*-\n# Generated by the protocol buffer compiler.  DO NOT EDIT!\nX = 1\n",
    )
    doc = read_one(repo)
    # Words in a docstring or an ordinary comment are not markers; c.py's marker is below the head.
    assert set(offsets(doc)) == {"a.py", "nodes.py", "notes.py", "c.py"}
    assert skipped(doc) == dict.fromkeys(("b.py", "d.ts", "e.go", "f.h", "g.py", "h.c", "i.py"), "generated")


def test_jinja2_nodes_is_kept(tmp_path: Path) -> None:
    """The real ``jinja2/nodes.py`` says "AST nodes generated by the parser" in its docstring."""
    jinja2 = pytest.importorskip("jinja2")
    nodes = Path(jinja2.__file__).parent / "nodes.py"
    assert "generated by the parser" in nodes.read_text(encoding="utf-8")[:500]
    write(tmp_path / "repos" / "jinja2", "nodes.py", nodes.read_text(encoding="utf-8"))
    assert "nodes.py" in offsets(read_one(tmp_path / "repos" / "jinja2"))


def test_prose_with_long_lines_is_not_minified(tmp_path: Path) -> None:
    repo = tmp_path / "docs"
    paragraph = "This paragraph is written on one line, as many Markdown files do. " * 40
    write(repo, "README.md", f"# Title\n\n{paragraph}\n\n{paragraph}\n")
    write(repo, "long.js", f"var s = '{paragraph}';\n")
    doc = read_one(repo)
    assert set(offsets(doc)) == {"README.md"}
    assert skipped(doc) == {"long.js": "minified"}


def test_repository_without_usable_files(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    (root / "empty").mkdir(parents=True)
    write(root, "assets/logo.png", b"\x89PNG")
    write(root, "assets/node_modules/lib.js", "var x = 1;\n")
    docs = {doc.id: doc for doc in CodeRepoReader(root).run(rank=0, world_size=1)}
    for repo_id in ("code/empty", "code/assets"):
        assert docs[repo_id].text == ""
        assert docs[repo_id].metadata["skip_reason"] == "no_source_files"
    assert "unsupported_extension: 1" in docs["code/assets"].metadata["skip_detail"]


# -------------------------------------------------------------------------------------- malicious


def test_symlink_to_system_file_is_never_read(tmp_path: Path) -> None:
    repo = tmp_path / "evil"
    write(repo, "ok.py", "X = 1\n")
    os.symlink("/etc/passwd", repo / "evil.py")
    os.symlink("/etc", repo / "etc")
    doc = read_one(repo)
    assert set(offsets(doc)) == {"ok.py"}
    assert skipped(doc) == {"evil.py": "symlink", "etc/": "symlink"}
    assert "root:" not in doc.text


def test_repository_code_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    payload = f"open({str(marker)!r}, 'w').write('pwned')\n"
    repo = tmp_path / "repos" / "harmful"
    write(repo, "__init__.py", payload)
    write(repo, "setup.py", payload)
    write(repo, "conftest.py", payload)
    write(repo, "harmful/__init__.py", payload)
    write(repo, "main.py", "import harmful\nimport setup\n" + payload)
    write(repo, "broken.py", "def (:\n" + payload)  # syntax error: no imports, still kept
    doc = read_one(repo)
    assert not marker.exists()
    assert_before(doc, [("harmful/__init__.py", "main.py"), ("setup.py", "main.py")])
    assert "broken.py" in offsets(doc)


# ------------------------------------------------------------------------------------- real code


def _copy_stdlib_package(name: str, dest: Path) -> Path:
    source = Path(sysconfig.get_paths()["stdlib"]) / name
    target = dest / name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_stdlib_json_and_email_as_repositories(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    json_repo = _copy_stdlib_package("json", root)
    email_repo = _copy_stdlib_package("email", root)
    # Facts from the stdlib source itself, checked before relying on them.
    facts = {
        (json_repo, "__init__.py"): "from .decoder import JSONDecoder",
        (json_repo, "decoder.py"): "from json import scanner",
        (email_repo, "feedparser.py"): "from email._policybase import compat32",
        (email_repo, "mime/nonmultipart.py"): "from email.mime.base import MIMEBase",
        (email_repo, "mime/base.py"): "from email import message",
        (email_repo, "mime/text.py"): "from email.mime.nonmultipart import MIMENonMultipart",
    }
    for (repo, rel), line in facts.items():
        assert line in (repo / rel).read_text(encoding="utf-8"), (rel, line)

    docs = {doc.id: doc for doc in CodeRepoReader(root).run(rank=0, world_size=1)}
    assert set(docs) == {"code/json", "code/email"}
    json_doc, email_doc = docs["code/json"], docs["code/email"]
    assert_before(json_doc, [("decoder.py", "__init__.py"), ("scanner.py", "decoder.py")])
    assert_before(
        email_doc,
        [
            ("_policybase.py", "feedparser.py"),
            ("mime/base.py", "mime/nonmultipart.py"),
            ("message.py", "mime/base.py"),
            ("mime/nonmultipart.py", "mime/text.py"),
        ],
    )
    expected_json = sorted(p.relative_to(json_repo).as_posix() for p in json_repo.rglob("*.py"))
    assert sorted(offsets(json_doc)) == expected_json
    assert json_doc.metadata["path"] == str(json_repo)


# -------------------------------------------------------------------------------------- datatrove


def test_list_units(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    for name in ("b-repo", "a-repo", ".hidden-repo"):
        write(root, f"{name}/x.py", "X = 1\n")
    write(root, "loose-file.py", "X = 1\n")
    write(tmp_path, "elsewhere/x.py", "X = 1\n")
    os.symlink(tmp_path / "elsewhere", root / "c-linked")
    units, _ = CodeRepoReader(root).list_units()
    assert {u.path: u.skip for u in units} == {
        ".hidden-repo": "hidden",
        "a-repo": "",
        "b-repo": "",
        "c-linked": "symlink",
        "loose-file.py": "not_a_repository",
    }
    docs = {doc.id: doc.metadata for doc in CodeRepoReader(root).run()}
    assert (
        docs["code/loose-file.py"]["skip_reason"] == "not_a_repository"
        and docs["code/loose-file.py"]["skipped"]
    )


def test_runs_as_a_stage_and_shards_cover_every_repo_once(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    names = [f"repo{i}" for i in range(5)]
    for name in names:
        write(root, f"{name}/main.py", f"NAME = {name!r}\n")
    (root / "empty").mkdir()
    everything = list(CodeRepoReader(root, source="gh").run(rank=0, world_size=1))
    assert [doc.id for doc in everything] == [f"gh/{n}" for n in sorted([*names, "empty"])]
    assert all(doc.metadata["source"] == "gh" for doc in everything)

    shards = [[doc.id for doc in CodeRepoReader(root, source="gh").run(rank=r, world_size=2)] for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == sorted(doc.id for doc in everything)
    assert not set(shards[0]) & set(shards[1])
    limited = {
        doc.id: doc.metadata.get("skip_reason") for doc in CodeRepoReader(root, source="gh", limit=2).run()
    }
    assert [i for i, reason in limited.items() if reason != "over_limit"] == ["gh/empty", "gh/repo0"]
    assert len(limited) == len(everything)


def test_metadata_types_are_consistent_across_documents(tmp_path: Path) -> None:
    make_python_repo(tmp_path / "repos")
    write(tmp_path / "repos", "other/main.go", "package main\n")
    write(tmp_path / "repos", "other/logo.png", b"\x89PNG")
    docs = [doc for doc in CodeRepoReader(tmp_path / "repos").run() if "skip_reason" not in doc.metadata]
    assert len(docs) == 2
    for doc in docs:
        meta = doc.metadata
        assert {k: type(v) for k, v in meta.items()} == {
            "files": list,
            "skipped_files": list,
            "n_files": int,
            "n_skipped_files": int,
            "n_import_edges": int,
            "duplicate_files": list,
            "source": str,
            "path": str,
            "input_files": int,
        }
        assert all(set(e) == {"path", "offset", "length"} for e in meta["files"])
        assert all(isinstance(e["offset"], int) and isinstance(e["length"], int) for e in meta["files"])
        assert all(set(e) == {"path", "reason", "files"} for e in meta["skipped_files"])
        json.dumps(meta)  # plain data only


def test_invalid_max_file_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_file_bytes"):
        CodeRepoReader(tmp_path, max_file_bytes=0)

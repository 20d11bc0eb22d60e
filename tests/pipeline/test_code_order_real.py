"""Property over real code documents: every in-repository import edge that is not inside an import
cycle points backwards (the imported file comes first in the document).

The repositories are the running interpreter's standard-library packages, read as data. The edges
are recomputed from each file's text as it stands in the document, and cycles are found as
strongly connected components, independently of the order the reader produced.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from longctx.pipeline.default_corpus import EXCLUDED_PACKAGES, stdlib_dir
from longctx.pipeline.readers.code import FILE_HEADER, CodeRepoReader
from longctx.pipeline.readers.code_order import file_dependencies, strongly_connected_components


@pytest.fixture(scope="module")
def stdlib_repos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stdlib")
    for package in sorted(stdlib_dir().iterdir()):
        if package.is_dir() and (package / "__init__.py").is_file() and package.name not in EXCLUDED_PACKAGES:
            shutil.copytree(
                package, root / package.name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True
            )
    return root


def test_every_acyclic_import_edge_points_backwards(stdlib_repos: Path) -> None:
    docs = [d for d in CodeRepoReader(stdlib_repos).run() if not d.metadata.get("skip_reason")]
    assert len(docs) >= 20
    checked = 0
    for doc in docs:
        spans = doc.metadata["files"]
        texts = {}
        for span in spans:
            block = doc.text[span["offset"] : span["offset"] + span["length"]]
            header = FILE_HEADER.format(path=span["path"])
            assert block.startswith(header), (doc.id, span["path"])
            texts[span["path"]] = block[len(header) :]
        position = {span["path"]: i for i, span in enumerate(spans)}
        deps = file_dependencies(texts, doc.id.split("/", 1)[1])
        component = strongly_connected_components(deps)
        for importer, imported in deps.items():
            for dep in imported:
                if dep != importer and component[dep] != component[importer]:
                    assert position[dep] < position[importer], (
                        f"{doc.id}: {importer} comes before its import {dep}"
                    )
                    checked += 1
    assert checked > 100  # the property was exercised on many real edges

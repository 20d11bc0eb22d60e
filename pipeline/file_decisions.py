"""The decisions of file-level code deduplication, as stored between its stages and the repository
reader (:mod:`longctx.pipeline.filededup` writes them, :mod:`longctx.pipeline.readers.code` reads them)."""

from __future__ import annotations

import os
from collections import defaultdict

import pyarrow as pa

from longctx.pipeline.parquet import read_parquet

FILE_DECISIONS_SCHEMA = pa.schema(
    [
        ("repo", pa.string()),  # the repository that loses the file
        ("path", pa.string()),  # the file, inside that repository
        ("duplicate_of", pa.string()),  # the repository that keeps the copy
        ("of_path", pa.string()),  # the kept copy, inside that repository
        ("kind", pa.string()),  # exact_duplicate | near_duplicate
        ("jaccard", pa.float64()),  # estimated Jaccard similarity of their word n-grams (1 when exact)
        ("containment", pa.float64()),  # share of the file's n-grams inside the kept copy's (1 when exact)
    ]
)


def load_file_decisions(path: str | os.PathLike) -> dict[str, list[dict]]:
    """The files each repository loses to file-level deduplication: repository id -> list of
    ``{"path", "duplicate_of", "of_path", "kind"}``, sorted by path."""
    table = read_parquet(path, FILE_DECISIONS_SCHEMA)
    found: dict[str, list[dict]] = defaultdict(list)
    for row in table.sort_by([("repo", "ascending"), ("path", "ascending")]).to_pylist():
        found[row["repo"]].append(
            {
                "path": row["path"],
                "duplicate_of": row["duplicate_of"],
                "of_path": row["of_path"],
                "kind": row["kind"],
            }
        )
    return dict(found)

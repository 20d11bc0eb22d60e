"""File-level code deduplication across repositories: the stages run here in-process on repositories
built in the test, with copies of known kinds (exact, edited, vendored, forked, within one repository)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets

from longctx.pipeline.config import FileDedupConfig
from longctx.pipeline.file_decisions import load_file_decisions
from longctx.pipeline.filededup import (
    FileDuplicateResolver,
    FileSignatureIndex,
    RepositoryFiles,
    minhash_config,
    similarity,
)
from longctx.pipeline.keep import file_rank, vendored_depth
from longctx.pipeline.readers.code import CodeRepoReader

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
]


def module(seed: int, functions: int) -> str:
    rng = random.Random(seed)
    parts = []
    for i in range(functions):
        a, b, c = rng.sample(WORDS, 3)
        parts.append(
            f"def {a}_{b}_{i}({c}, n={rng.randint(0, 999)}):\n"
            f"    return {c} * n + {rng.randint(0, 999)}  # {a} {b}\n"
        )
    return "\n".join(parts)


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


CORE, UTIL, TINY = module(1, 60), module(2, 30), "VERSION = '1.0'\n"


@pytest.fixture(scope="module")
def code(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("filededup") / "code"
    write(root, "upstream/lib/core.py", CORE)
    write(root, "upstream/lib/util.py", UTIL)
    write(root, "upstream/lib/version.py", TINY)
    write(root, "upstream/lib/core_again.py", CORE)  # a copy inside one repository stays
    write(root, "upstream/README.md", "# upstream\n\nThe library.\n")
    # an application vendoring an older upstream: exact copies, and util.py with a few functions dropped
    write(root, "app/app.py", module(3, 40))
    write(root, "app/_vendor/lib/core.py", CORE)
    write(root, "app/_vendor/lib/util.py", UTIL.rsplit("\ndef ", 3)[0] + "\n")
    write(root, "app/_vendor/lib/version.py", TINY)
    # a fork with nothing of its own, and a repository that only shares a short, common file
    for rel, text in (
        ("lib/core.py", CORE),
        ("lib/util.py", UTIL),
        ("README.md", "# upstream\n\nThe library.\n"),
    ):
        write(root, f"upstream-fork/{rel}", text)
    write(root, "other/other.py", module(4, 40))
    write(root, "other/pkg/sub/version.py", TINY)  # deeper than upstream's: upstream's copy is kept
    return root


def run_file_dedup(code: Path, work: Path, cfg: FileDedupConfig) -> dict[str, list[dict]]:
    """The three file-level stages, in-process, with two tasks for the first."""
    reader = CodeRepoReader(code)
    config = minhash_config(cfg)
    for rank in range(2):
        index = FileSignatureIndex(work / "sigs", work / "index", cfg)
        index.run(RepositoryFiles([reader]).run(None, rank, 2), rank, 2)
    for band in range(config.num_buckets):
        MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config).run(
            None, band, config.num_buckets
        )
    list(FileDuplicateResolver(work / "index", work / "buckets", work / "decisions.parquet", cfg).run())
    return load_file_decisions(work / "decisions.parquet")


@pytest.fixture(scope="module")
def decisions(code: Path, tmp_path_factory) -> dict[str, list[dict]]:
    return run_file_dedup(code, tmp_path_factory.mktemp("work"), FileDedupConfig())


def lost(decisions: dict, repo: str) -> dict[str, tuple[str, str, str]]:
    return {d["path"]: (d["duplicate_of"], d["of_path"], d["kind"]) for d in decisions.get(repo, [])}


def test_vendored_copies_are_removed_from_the_vendoring_repository(decisions) -> None:
    assert lost(decisions, "code/app") == {
        "_vendor/lib/core.py": ("code/upstream", "lib/core.py", "exact_duplicate"),
        "_vendor/lib/util.py": ("code/upstream", "lib/util.py", "near_duplicate"),
        "_vendor/lib/version.py": ("code/upstream", "lib/version.py", "exact_duplicate"),
    }


def test_upstream_keeps_everything_including_its_own_copies(decisions) -> None:
    assert lost(decisions, "code/upstream") == {}


def test_a_fork_with_nothing_of_its_own_loses_every_file(decisions) -> None:
    assert set(lost(decisions, "code/upstream-fork")) == {"lib/core.py", "lib/util.py", "README.md"}
    assert {origin for origin, _, _ in lost(decisions, "code/upstream-fork").values()} == {"code/upstream"}


def test_an_unrelated_repository_only_loses_the_exact_copy(decisions) -> None:
    assert lost(decisions, "code/other") == {
        "pkg/sub/version.py": ("code/upstream", "lib/version.py", "exact_duplicate")
    }


def test_the_reader_leaves_removed_files_out_and_lists_them(code: Path, decisions, tmp_path: Path) -> None:
    table = pa.Table.from_pylist(
        [
            {
                "repo": r,
                "path": d["path"],
                "duplicate_of": d["duplicate_of"],
                "of_path": d["of_path"],
                "kind": d["kind"],
                "jaccard": 1.0,
                "containment": 1.0,
            }
            for r, rows in decisions.items()
            for d in rows
        ]
    )
    pq.write_table(table, tmp_path / "decisions.parquet")
    docs = {d.id: d for d in CodeRepoReader(code, file_decisions=tmp_path / "decisions.parquet").run()}
    app = docs["code/app"]
    assert [f["path"] for f in app.metadata["files"]] == ["app.py"]
    assert CORE not in app.text and "app.py" in app.text
    assert {d["path"] for d in app.metadata["duplicate_files"]} == set(lost(decisions, "code/app"))
    # every file of the repository is kept, skipped or removed as a duplicate: the counts add up
    meta = app.metadata
    assert (
        meta["n_files"] + sum(s["files"] for s in meta["skipped_files"]) + len(meta["duplicate_files"])
        == meta["input_files"]
        == 4
    )
    fork = docs["code/upstream-fork"]
    assert fork.text == "" and fork.metadata["copy_of"] == "code/upstream"
    assert CORE in docs["code/upstream"].text


def test_keep_policy_is_configurable(code: Path, tmp_path: Path) -> None:
    """Ranking by length alone, the longer, upstream util.py is kept either way, but the fork's
    identical files now tie and go to the smaller repository id: the fork keeps them."""
    decisions = run_file_dedup(code, tmp_path, FileDedupConfig(keep=["longest"]))
    assert "lib/core.py" in lost(decisions, "code/upstream")
    assert lost(decisions, "code/upstream")["lib/core.py"][0] in ("code/app", "code/upstream-fork")


def test_similarity_from_signatures_and_directional_containment() -> None:
    rng = np.random.default_rng(0)
    a = set(range(1000))
    b = set(range(3000))  # a inside b
    params = rng.integers(1, 2**31, size=(2, 256))
    signature = lambda s: np.min((np.array(sorted(s))[:, None] * params[0] + params[1]) % (2**31 - 1), axis=0)  # noqa: E731
    jaccard, a_in_b = similarity(signature(a), signature(b), len(a), len(b))
    _, b_in_a = similarity(signature(b), signature(a), len(b), len(a))
    assert abs(jaccard - 1 / 3) < 0.1
    assert a_in_b > 0.85 and b_in_a < 0.45


def test_vendored_and_forked_paths() -> None:
    assert vendored_depth("/data/code/pip/src/pip/_vendor/requests/api.py") == 1
    assert vendored_depth("/data/code/requests/requests/api.py") == 0
    assert vendored_depth("/data/forks/papers/attention.tex") == 1
    assert vendored_depth("/data/papers/attention-fork.tex") == 1
    assert vendored_depth("/data/code/node_modules/x/third_party/y.js") == 2
    keep = ["not_vendored", "longest", "shallowest"]
    upstream = file_rank(
        keep, repo="code/requests", rel="requests/api.py", location="/c/requests/requests/api.py", chars=10
    )
    vendored = file_rank(
        keep,
        repo="code/pip",
        rel="src/pip/_vendor/requests/api.py",
        location="/c/pip/src/pip/_vendor/requests/api.py",
        chars=99,
    )
    assert upstream < vendored


@pytest.mark.parametrize("piece_chars", [None, 60])
def test_file_index_equals_datatrove_shingles_and_signatures(
    tmp_path: Path, monkeypatch, piece_chars
) -> None:
    """Every file's n-gram count and signature in the index, and the bucket files, against
    datatrove's own MinHash stage 1 (its ``get_shingles``, ``np.unique`` and ``get_signature``) with
    the same word splitter: files around ``min_words``, repeated lines, non-ASCII identifiers, and
    (``piece_chars``) texts hashed in many pieces."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    from longctx.pipeline import signatures as sg

    if piece_chars:
        monkeypatch.setattr(sg, "PIECE_CHARS", piece_chars)
    cfg = FileDedupConfig()
    config = minhash_config(cfg)
    texts = [module(s, n) for s, n in ((1, 30), (2, 1), (3, 5))]
    texts += [module(4, 8) * 3, "x = 1\n", "", "def größe(ΣΑΣ):\n    return 'café' + ΣΑΣ  # ü\n" * 20]
    texts += [" ".join(f"w{i}" for i in range(n)) for n in (cfg.min_words - 1, cfg.min_words, 48, 49)]
    docs = [
        Document(
            text=t,
            id=f"code/r/{i}.py",
            metadata={"repo": "code/r", "rel": f"{i}.py", "location": f"/r/{i}.py"},
        )
        for i, t in enumerate(texts)
    ]
    FileSignatureIndex(tmp_path / "ours", tmp_path / "index", cfg).run(iter(docs), 0, 1)
    theirs = MinhashDedupSignature(str(tmp_path / "theirs"), config=config, language=sg.RegexWordTokenizer())
    rows = pq.read_table(tmp_path / "index" / "00000.parquet").to_pylist()
    assert len(rows) == len(texts)
    expected_docs = []
    for row, text in zip(rows, texts):
        shingles = theirs.get_shingles(text)
        words = shingles.shape[0] + config.n_grams - 1 if shingles.shape[0] else 0
        if words < cfg.min_words:
            assert (row["ngrams"], row["signature"]) == (0, [])
            continue
        unique = np.unique(shingles).reshape(-1, 1)
        expected_docs.append(Document(text=text, id=row["path"]))
        assert row["ngrams"] == unique.shape[0]
        assert row["signature"] == [v for band in theirs.get_signature(unique) for v in band]
    assert 0 < len(expected_docs) < len(texts)  # both sides of min_words were present
    # datatrove's run over the files that have a signature writes the same bucket records (the
    # document index in each record counts every file, so compare signatures only)
    for bucket in range(config.num_buckets):
        ours = (tmp_path / "ours" / f"bucket_{bucket:03d}" / "00000.minhash.sig").read_bytes()
        record = config.hashes_per_bucket * 4 + 4
        sigs = sorted(ours[i : i + record - 4] for i in range(0, len(ours), record))
        want = sorted(
            np.array(
                theirs.get_signature(np.unique(theirs.get_shingles(d.text)).reshape(-1, 1))[bucket], np.uint32
            ).tobytes()
            for d in expected_docs
        )
        assert sigs == want


PACKAGE_FILES = {  # name -> (imports as upstream writes them, seed of the body)
    "__init__.py": ("import urllib3\nimport chardet\nfrom . import api, sessions\n", 11),
    "api.py": ("from . import sessions\n", 12),
    "sessions.py": ("import urllib3\nfrom urllib3.util import retry\nfrom .models import Request\n", 13),
    "models.py": ("import chardet\nfrom urllib3.fields import RequestField\n", 14),
    "adapters.py": (
        "from urllib3.poolmanager import PoolManager\nfrom urllib3.util.retry import Retry\n",
        15,
    ),
    "structures.py": ("from collections import OrderedDict\n", 16),
    "__version__.py": ("", 17),
}


def vendor_rewritten(imports: str) -> str:
    """The imports as pip rewrites them when it vendors the package (``pip._vendor.<name>``)."""
    out = []
    for line in imports.splitlines():
        for name in ("urllib3", "chardet"):
            if line == f"import {name}":
                line = f"from pip._vendor import {name}"
            line = line.replace(f"from {name}.", f"from pip._vendor.{name}.").replace(
                f"from {name} ", f"from pip._vendor.{name} "
            )
        out.append(line)
    return "\n".join(out) + ("\n" if out else "")


@pytest.fixture(scope="module")
def vendored_pair(tmp_path_factory) -> Path:
    """psf/requests' shape (a pyproject.toml naming the package, the package under ``src/``) beside
    pip's vendored copy of the package folder alone, as its own repository, its imports rewritten to
    ``pip._vendor.*``, with no vendored folder in its path: the copy is shallower, and longer."""
    root = tmp_path_factory.mktemp("vendoredpair") / "code"
    write(root, "requests/pyproject.toml", '[project]\nname = "requests"\nversion = "2.32.3"\n')
    write(root, "requests/README.md", "# Requests\n\nHTTP for Humans.\n")
    for name, (imports, seed) in PACKAGE_FILES.items():
        body = module(seed, 25)
        write(root, f"requests/src/requests/{name}", imports + body)
        write(root, f"pip-requests/requests/{name}", vendor_rewritten(imports) + body)
    return root


def test_the_upstream_repository_keeps_its_files_and_the_rewritten_copy_loses_them(
    vendored_pair: Path, tmp_path: Path
) -> None:
    decisions = run_file_dedup(vendored_pair, tmp_path / "now", FileDedupConfig())
    assert lost(decisions, "code/requests") == {}
    assert lost(decisions, "code/pip-requests") == {
        f"requests/{name}": (
            "code/requests",
            f"src/requests/{name}",
            "near_duplicate" if vendor_rewritten(imports) != imports else "exact_duplicate",
        )
        for name, (imports, _) in PACKAGE_FILES.items()
    }
    # the reference: ranked by path and length alone (the former default), upstream lost its files
    before = run_file_dedup(
        vendored_pair, tmp_path / "before", FileDedupConfig(keep=["not_vendored", "longest", "shallowest"])
    )
    assert len(lost(before, "code/requests")) == len(PACKAGE_FILES)

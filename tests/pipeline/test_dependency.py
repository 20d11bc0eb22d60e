"""The model-free long-range dependency score, its filters and its reporting.

References are independent of the code under test: segment similarities are recounted here with
Python sets of token trigrams, the AUC by counting every pair, the quantiles and the kept sets from
the ledger's own scores, and the documents are built in ``dependency_cases`` from generated text,
the standard library's packages and the shared corpus' books.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from datatrove.data import Document

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.dedup import DECISIONS_SCHEMA
from longctx.pipeline.dependency import (
    BACKGROUND_SCHEMA,
    BACKGROUND_SEGMENTS,
    MIN_SEGMENTS,
    NGRAM,
    PAIRS_PER_DISTANCE,
    SEGMENT_TOKENS,
    DependencyScorer,
    DependencySelection,
    Sharing,
    background_similarity,
    dependency_score,
    document_sharing,
    far_pairs,
    read_scores,
    select,
    source_backgrounds,
)
from longctx.pipeline.docstore import StageDocumentWriter
from longctx.pipeline.stats import format_summary
from tests.pipeline.dependency_cases import (
    auc,
    corpus_books,
    deal_across,
    encoder,
    joined,
    referring_halves,
    repository_blocks,
    score_documents,
    stdlib_repositories,
)

# --- the score's parts against a direct count ---------------------------------------------------------


def segment_sets(ids: np.ndarray) -> list[set[tuple[int, ...]]]:
    """Each segment's set of trigrams (those that start in it), as Python tuples."""
    segments = len(ids) // SEGMENT_TOKENS
    tokens = [int(t) for t in ids[: segments * SEGMENT_TOKENS]]
    sets: list[set[tuple[int, ...]]] = [set() for _ in range(segments)]
    for start in range(len(tokens) - NGRAM + 1):
        sets[start // SEGMENT_TOKENS].add(tuple(tokens[start : start + NGRAM]))
    return sets


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


def test_far_pairs_are_a_quarter_to_three_quarters_apart() -> None:
    for segments in (8, 9, 40, 100, 1000):
        pairs = far_pairs(segments)
        distances = [d for d, _ in pairs]
        assert distances == sorted(set(distances))
        assert min(distances) >= max(2, segments // 4 - 1) and max(distances) <= math.ceil(3 * segments / 4)
        for distance, firsts in pairs:
            starts = segments - distance
            assert len(firsts) == min(PAIRS_PER_DISTANCE, starts)
            assert firsts[0] == 0 and firsts[-1] == starts - 1  # spread over the whole document
            assert (np.diff(firsts) > 0).all()
    assert [d for d, _ in far_pairs(100)] == [25, 38, 50, 62, 75]


@pytest.mark.parametrize("tokens", [8 * SEGMENT_TOKENS, 8 * SEGMENT_TOKENS + 300, 150 * SEGMENT_TOKENS + 7])
def test_near_and_far_are_the_mean_jaccard_of_trigram_sets(tokens: int) -> None:
    """Across block boundaries too (150 segments: three blocks), with repeats at every distance: a
    small vocabulary, and passages copied from far back."""
    rng = np.random.default_rng(tokens)
    ids = rng.integers(0, 40, size=tokens).astype(np.uint32)
    for start in range(SEGMENT_TOKENS * 3, tokens - 200, SEGMENT_TOKENS * 2):
        source = rng.integers(0, start - 200)
        ids[start : start + 200] = ids[source : source + 200]
    sharing, picked = document_sharing(ids, background=True)
    sets = segment_sets(ids)
    assert sharing.segments == len(sets)
    near = [jaccard(sets[i], sets[i + 1]) for i in range(len(sets) - 1)]
    far = [jaccard(sets[f], sets[f + d]) for d, firsts in far_pairs(len(sets)) for f in firsts.tolist()]
    assert sharing.near == pytest.approx(np.mean(near), rel=1e-12)
    assert sharing.far == pytest.approx(np.mean(far), rel=1e-12)
    # the background segments: evenly spaced, each the segment's distinct trigrams
    expected = sorted({round(x) for x in np.linspace(0, len(sets) - 1, BACKGROUND_SEGMENTS)})
    assert [len(p) for p in picked] == [len(sets[i]) for i in expected]


def test_background_is_the_mean_jaccard_of_segments_of_different_documents() -> None:
    rng = np.random.default_rng(1)
    documents = [rng.integers(0, 30, size=(9 + k) * SEGMENT_TOKENS).astype(np.uint32) for k in range(3)]
    picked = [document_sharing(ids, background=True)[1] for ids in documents]
    sets = [segment_sets(ids) for ids in documents]
    spots = [sorted({round(x) for x in np.linspace(0, len(s) - 1, BACKGROUND_SEGMENTS)}) for s in sets]
    segments = [(d, sets[d][i]) for d in range(3) for i in spots[d]]
    expected = [jaccard(a, b) for k, (d, a) in enumerate(segments) for e, b in segments[k + 1 :] if d != e]
    assert background_similarity(picked) == pytest.approx(np.mean(expected), rel=1e-12)
    assert background_similarity(picked[:1]) == 0.0  # one document: no pair of different ones


def test_short_documents_have_no_score() -> None:
    assert document_sharing(None) == (None, [])
    assert document_sharing(np.arange(MIN_SEGMENTS * SEGMENT_TOKENS - 1, dtype=np.uint32))[0] is None
    assert document_sharing(np.arange(MIN_SEGMENTS * SEGMENT_TOKENS, dtype=np.uint32))[0] is not None


def test_score_is_the_excess_over_chance_in_units_of_local_sharing() -> None:
    assert dependency_score(Sharing(10, near=0.30, far=0.20), 0.10) == pytest.approx(0.5)
    assert dependency_score(Sharing(10, near=0.30, far=0.10), 0.10) == 0.0  # chance: 0
    assert dependency_score(Sharing(10, near=0.30, far=0.30), 0.10) == pytest.approx(1.0)
    assert dependency_score(Sharing(10, near=0.30, far=0.05), 0.10) == pytest.approx(-0.25)
    # adjacent segments sharing less than twice chance: measured in units of chance
    assert dependency_score(Sharing(10, near=0.12, far=0.15), 0.10) == pytest.approx(0.5)
    assert dependency_score(Sharing(10, near=0.0, far=0.0), 0.0) == 0.0


def test_select_drops_by_minimum_and_rank_judging_each_by_its_best_score() -> None:
    scored = {
        "b/1": ("b", 0.9, None),
        "b/2": ("b", 0.1, 0.8),  # the model's score decides
        "b/3": ("b", 0.5, None),
        "b/4": ("b", 0.5, None),  # ties: the smaller id ranks first
        "b/5": ("b", 0.05, None),
        "b/6": ("b", None, None),  # unscored: not judged
        "b/dup": ("b", 0.99, None),  # a duplicate: neither judged nor ranked
        "c/1": ("c", -0.5, None),  # no filter for source c
    }
    dropped = select(scored, {"b/dup"}, {"b": (0.1, 0.5)})
    # judged: 0.9, 0.8, 0.5 (b/3), 0.5 (b/4), 0.05 -> the best ceil(0.5 * 5) = 3 are b/1, b/2, b/3
    assert dropped == {"b/4": "not_top_dependency", "b/5": "low_dependency"}
    assert select(scored, set(), {"b": (None, 1.0)}) == {}
    assert select(scored, set(), {"b": (0.6, None)}) == {
        "b/3": "low_dependency",
        "b/4": "low_dependency",
        "b/5": "low_dependency",
    }


def test_background_of_a_source_with_fewer_than_two_documents_is_every_source_s() -> None:
    rng = np.random.default_rng(2)
    docs = {
        name: document_sharing(
            rng.integers(0, 30, size=9 * SEGMENT_TOKENS).astype(np.uint32), background=True
        )[1]
        for name in ("a/1", "a/2", "a/3", "b/1", "c/dup")
    }
    rows = [
        (name.split("/")[0], order, name, hashes) for order, name in enumerate(docs) for hashes in docs[name]
    ]
    table = pa.table(dict(zip(BACKGROUND_SCHEMA.names, zip(*rows))), schema=BACKGROUND_SCHEMA)
    found = source_backgrounds(table, {"c/dup"}, ["a", "b", "c"])
    assert found["a"] == {
        "similarity": background_similarity([docs["a/1"], docs["a/2"], docs["a/3"]]),
        "documents": 3,
        "measured_on": "source",
    }
    every = {
        "similarity": background_similarity([docs[n] for n in ("a/1", "a/2", "a/3", "b/1")]),
        "documents": 4,
    }
    assert (
        found["b"] == found["c"] == every | {"measured_on": "all sources"}
    )  # c's only document: a duplicate
    assert source_backgrounds(table.slice(0, len(docs["a/1"])), set(), ["a"])["a"] == {
        "similarity": 0.0,
        "documents": 0,
        "measured_on": "nothing",
    }


def test_the_filters_judge_by_the_model_score_where_the_stage_files_hold_one(tmp_path: Path) -> None:
    """The interface for the model score: metadata ``dependency_model``, set before the stage files are
    written, reaches the scores file and decides the filters, where a document has one."""
    rng = np.random.default_rng(3)
    docs = []
    for k in range(6):
        ids = rng.integers(0, 25 + 10 * k, size=10 * SEGMENT_TOKENS).astype(np.uint32)
        model = {0: 0.9, 1: 0.1}.get(k)  # two documents with a model score
        metadata = {"source": "books", "token_ids": ids, "token_count": len(ids), "dependency_model": model}
        docs.append(Document(text="x" * len(ids), id=f"books/{k}", metadata=metadata))
    with StageDocumentWriter(tmp_path / "stage") as writer:
        for doc in DependencyScorer(tmp_path / "dependency").run(iter(docs)):
            writer.write(doc, 0)
    pq.write_table(DECISIONS_SCHEMA.empty_table(), tmp_path / "decisions.parquet")
    step = DependencySelection(
        tmp_path / "dependency", tmp_path / "decisions.parquet", {"books": (0.5, None)}, tmp_path / "stage"
    )
    assert list(step.run()) == []
    scores = read_scores(tmp_path / "dependency" / "scores.parquet")
    assert scores["books/0"][1:] == (0.9, "") and scores["books/1"][1:] == (0.1, "low_dependency")
    for k in range(2, 6):
        free, model, reason = scores[f"books/{k}"]
        assert model is None and reason == ("low_dependency" if free < 0.5 else "")
    assert all(scores[f"books/{k}"][0] is not None for k in range(6))  # the model-free score beside


# --- validation: documents with and without long-range dependencies ------------------------------


@pytest.fixture(scope="module")
def synthetic_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    texts = [a + b for a, b in (referring_halves(1000 + seed) for seed in range(12))]
    return train_bpe(texts, 1000, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_second_halves_that_refer_back_outscore_unrelated_second_halves(synthetic_tokenizer) -> None:
    pairs = 60
    encode = encoder(synthetic_tokenizer)
    halves = [referring_halves(seed) for seed in range(pairs)]
    firsts, seconds = encode([a for a, _ in halves]), encode([b for _, b in halves])
    related = {i: joined([firsts[i], seconds[i]]) for i in range(pairs)}
    unrelated = {i: joined([firsts[i], seconds[(i + 1) % pairs]]) for i in range(pairs)}
    background = list(related.values())
    positives = score_documents(related, background)
    negatives = score_documents(unrelated, background)
    assert len(positives) == len(negatives) == pairs  # every document long enough to score
    assert auc(list(positives.values()), list(negatives.values())) >= 0.9


def test_books_outscore_their_chapters_shuffled_across_books(shared_corpus: Path, tmp_path: Path) -> None:
    books = corpus_books(shared_corpus)
    assert len(books) >= 8
    sample = [c[i : i + 20_000] for chapters in books.values() for c in chapters[::5] for i in (0, 20_000)]
    encode = encoder(train_bpe(sample, 4096, tmp_path / "tokenizer.json"))
    parts = {name: encode(chapters) for name, chapters in books.items()}
    real = {name: joined(p) for name, p in parts.items()}
    shuffled = {name: joined(p) for name, p in deal_across(parts).items()}
    background = list(real.values())
    scores, across = score_documents(real, background), score_documents(shuffled, background)
    assert len(scores) == len(across) == len(books)
    assert all(scores[name] > across[name] for name in books), (scores, across)
    assert auc(list(scores.values()), list(across.values())) >= 0.9
    # chapters of unrelated books share little more than chance (one far pair in about ten falls
    # within one book's chapters): their scores are near 0, the books' several times higher
    assert float(np.median(list(across.values()))) < 0.15 < float(np.median(list(scores.values())))


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], dict]]:
    """The default corpus' standard-library packages of 30-400 KB, tokenized file by file: each
    package's dependency order and its files' token ids."""
    packages = stdlib_repositories(30_000, 400_000)
    blocks = {package.name: repository_blocks(package) for package in packages}
    sample = [text[:20_000] for _, files in blocks.values() for text in list(files.values())[::3]]
    encode = encoder(train_bpe(sample, 2048, tmp_path_factory.mktemp("code") / "tokenizer.json"))
    return {
        name: (order, dict(zip(order, encode([files[p] for p in order]))))
        for name, (order, files) in blocks.items()
    }


def test_repositories_score_as_high_in_dependency_order_as_in_random_order(repositories) -> None:
    """The score is symmetric, so it cannot prefer definitions before their uses: a repository in
    dependency order scores about as high as the same files shuffled (averaged over the packages and
    5 orders each; bench_dependency.py measured +0.004 over 24 packages and 8 orders), and, its files
    sharing names and idioms, above chance."""
    dependency = {name: joined([ids[p] for p in order]) for name, (order, ids) in repositories.items()}
    background = list(dependency.values())
    scores = score_documents(dependency, background)
    assert len(scores) >= 8
    differences = []
    for name in scores:
        order, ids = repositories[name]
        shuffled = {}
        for seed in range(5):
            paths = list(order)
            random.Random(f"{name}{seed}").shuffle(paths)
            shuffled[seed] = joined([ids[p] for p in paths])
        differences.append(scores[name] - np.mean(list(score_documents(shuffled, background).values())))
    assert np.mean(differences) >= -0.02, differences
    assert min(scores.values()) > 0, scores


# --- curation: scores stored, filters applied, reports ------------------------------------------


def write_books(folder: Path) -> dict[str, str]:
    """Books of generated text: four whose second half refers to the first, four whose halves come
    from unrelated documents, and one too short to score. Returns what each is."""
    folder.mkdir(parents=True)
    kinds = {}
    for seed in range(4):
        first, second = referring_halves(seed)
        (folder / f"holistic{seed}.txt").write_text(first + second)
        kinds[f"books/holistic{seed}.txt"] = "holistic"
        first, _ = referring_halves(10 + seed)
        _, second = referring_halves(20 + seed)
        (folder / f"aggregate{seed}.txt").write_text(first + second)
        kinds[f"books/aggregate{seed}.txt"] = "aggregate"
    (folder / "short.txt").write_text(referring_halves(30, words_per_half=300)[0])
    kinds["books/short.txt"] = "short"
    return kinds


@pytest.fixture(scope="module")
def curation_input(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dependency_curation")
    kinds = write_books(root / "input" / "books")
    papers = root / "input" / "papers"
    papers.mkdir()
    for seed in range(2):
        (papers / f"paper{seed}.md").write_text("".join(referring_halves(40 + seed)))
    texts = [a + b for a, b in (referring_halves(100 + seed) for seed in range(8))]
    train_bpe(texts, 1000, root / "tokenizer.json")
    return {"root": root, "kinds": kinds}


def curate(root: Path, output: str, tasks: int = 2, **dependency) -> tuple[Path, dict]:
    config = {
        "output": str(root / output),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "curate": {"input": str(root / "input"), "executor": {"tasks": tasks, "workers": tasks}},
    }
    if dependency:
        config["curate"]["dependency"] = dependency
    return root / output, jobs.curate(parse_config(config))


def ledger_of(output: Path) -> dict[str, dict]:
    return {row["id"]: row for row in pq.read_table(output / "ledger.parquet").to_pylist()}


def curated_rows(output: Path) -> dict[str, dict]:
    rows = {}
    for path in sorted((output / "documents").rglob("*.parquet")):
        for row in pq.read_table(path, columns=["id", "dependency", "dependency_model"]).to_pylist():
            rows[row["id"]] = row
    return rows


MINIMUM, TOP = 0.3, 0.375


@pytest.fixture(scope="module")
def filtered(curation_input) -> tuple[Path, dict, dict]:
    """A run with filters on ``books`` (2 tasks; the bounds drop documents for both reasons: the
    aggregates score 0.28-0.38 and the others 0.64-0.67 with this tokenizer) and one without (1 task)."""
    root = curation_input["root"]
    output, summary = curate(
        root, "filtered", filters={"books": {"min_dependency": MINIMUM, "keep_top_fraction": TOP}}
    )
    _, unfiltered = curate(root, "unfiltered", tasks=1)
    return output, summary, unfiltered


def test_filters_drop_by_score_and_record_why(curation_input, filtered) -> None:
    output, summary, _ = filtered
    ledger = ledger_of(output)
    kinds = curation_input["kinds"]
    books = {i: r for i, r in ledger.items() if i.startswith("books/")}
    assert books["books/short.txt"]["dependency"] is None and books["books/short.txt"]["outcome"] == "kept"
    judged = {i: r["dependency"] for i, r in books.items() if r["dependency"] is not None}
    assert len(judged) == 8
    top = sorted(judged, key=lambda i: (-judged[i], i))[: math.ceil(TOP * len(judged))]
    for doc_id, score in judged.items():
        row = ledger[doc_id]
        if score < MINIMUM:
            assert (row["outcome"], row["reason"]) == ("filtered", "low_dependency")
        elif doc_id not in top:
            assert (row["outcome"], row["reason"]) == ("filtered", "not_top_dependency")
        else:
            assert (row["outcome"], row["reason"]) == ("kept", "")
    # both reasons were used, and the documents kept are some whose halves refer to each other
    assert {r["reason"] for r in books.values()} == {"", "low_dependency", "not_top_dependency"}
    kept = {i for i in judged if ledger[i]["outcome"] == "kept"}
    assert len(kept) == 3 and {kinds[i] for i in kept} == {"holistic"}
    # no filter for papers: every paper kept, with its score
    papers = [r for i, r in ledger.items() if i.startswith("papers/")]
    assert papers and all(r["outcome"] == "kept" and r["dependency"] is not None for r in papers)
    # every input ends kept, filtered, duplicate or skipped, and the counts add up
    for s in summary["sources"].values():
        assert s["inputs"] == s["kept"] + s["filtered"] + s["duplicate"] + s["skipped"]
    reasons = summary["sources"]["books"]["reasons"]
    dropped = [r["reason"] for r in books.values() if r["outcome"] == "filtered"]
    assert reasons == {reason: dropped.count(reason) for reason in set(dropped)}


def test_scores_are_columns_beside_the_text_and_in_the_ledger(filtered) -> None:
    output, _, _ = filtered
    ledger = ledger_of(output)
    rows = curated_rows(output)
    assert set(rows) == {i for i, r in ledger.items() if r["outcome"] == "kept"}
    for doc_id, row in rows.items():
        assert row["dependency"] == ledger[doc_id]["dependency"]
        assert row["dependency_model"] is None and ledger[doc_id]["dependency_model"] is None
    schema = pq.read_schema(next((output / "documents" / "books").glob("*.parquet")))
    assert str(schema.field("dependency").type) == "double"


def test_scores_do_not_depend_on_the_filters_nor_the_tasks(filtered) -> None:
    """The filtered run (2 tasks) and the unfiltered one (1 task) give every document the same score:
    the background is sampled by a hash of the ids, whatever the tasks."""
    output, _, _ = filtered
    unfiltered = ledger_of(output.parent / "unfiltered")
    assert all(r["outcome"] == "kept" for i, r in unfiltered.items() if i.startswith(("books/h", "books/a")))
    for doc_id, row in ledger_of(output).items():
        assert row["dependency"] == unfiltered[doc_id]["dependency"]


def test_stats_report_the_scores_per_source(filtered) -> None:
    output, summary, unfiltered = filtered
    assert json.loads((output / "stats.json").read_text())["sources"] == summary["sources"]
    ledger = ledger_of(output.parent / "unfiltered")
    for source in ("books", "papers"):
        block = unfiltered["sources"][source]["dependency"]
        values = [
            r["dependency"]
            for i, r in ledger.items()
            if r["source"] == source and r["dependency"] is not None
        ]
        assert block["scored"] == len(values)
        assert block["unscored"] == sum(
            1
            for r in ledger.values()
            if r["source"] == source and r["dependency"] is None and r["outcome"] == "kept"
        )
        for name, q in (("min", 0), ("p25", 25), ("median", 50), ("p90", 90), ("max", 100)):
            assert block["quantiles"][name] == round(float(np.percentile(values, q)), 4)
        assert sum(block["histogram"].values()) == len(values)
        for edge, count in block["histogram"].items():
            assert count == sum(1 for v in values if float(edge) <= v < float(edge) + 0.05)
        assert block["background"]["measured_on"] == "source" and block["background"]["similarity"] > 0
    books = unfiltered["sources"]["books"]["dependency"]
    median = (
        f"books {books['quantiles']['median']:.2f} ({books['scored']} scored, {books['unscored']} too short)"
    )
    assert f"dependency score, median per source: {median}; papers " in format_summary(unfiltered)
    # the filtered run reports the dropped documents' scores too
    assert summary["sources"]["books"]["dependency"]["scored"] == 8
    assert (output / "stats.png").stat().st_size > 10_000


def test_disabled_scores_nothing(curation_input) -> None:
    output, summary = curate(curation_input["root"], "disabled", tasks=1, enabled=False)
    assert all(r["dependency"] is None for r in ledger_of(output).values())
    assert all(r["dependency"] is None for r in curated_rows(output).values())
    assert all("dependency" not in s for s in summary["sources"].values())
    assert not (output / "work" / "curate" / "dependency").exists()


def test_filters_name_sources_of_the_run(curation_input, tmp_path: Path) -> None:
    root = curation_input["root"]
    with pytest.raises(
        ConfigError, match=r"curate\.dependency\.filters\.novels: the run has no source named"
    ):
        curate(root, "refused", filters={"novels": {"min_dependency": 0.1}})
    with pytest.raises(ConfigError, match="no dependency score is computed"):
        curate(root, "refused", enabled=False, filters={"books": {"min_dependency": 0.1}})
    assert not (root / "refused").exists()
    config = {
        "output": str(tmp_path / "out"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "curate": {
            "input": str(root / "input"),
            "dependency": {"filters": {"novels": {"keep_top_fraction": 0.5}}},
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(tmp_path / "run.yaml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "curate.dependency.filters.novels" in lines[0], done.stderr

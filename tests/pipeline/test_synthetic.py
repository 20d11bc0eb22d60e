"""Synthetic long-context tasks: needle placement and offsets, token budget, answers checked by
parsing the context independently, determinism, the datatrove stage and the curated layout."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import ParquetReader
from tokenizers import Tokenizer

from longctx.core.tokenizer import load_tokenizer
from longctx.packer.catalog import read_catalog
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.docstore import DocumentWriter
from longctx.pipeline.documents import SCORE_COLUMNS
from longctx.pipeline.readers.base import read_text_file
from longctx.pipeline.synthetic.kinds import DEFAULT_KINDS
from longctx.pipeline.synthetic.stage import (
    SyntheticTasks,
    example_document,
    synthetic_pipeline,
    write_synthetic_documents,
)
from longctx.pipeline.synthetic.tasks import (
    TASK_KINDS,
    Example,
    HaystackDoc,
    TaskSizes,
    build_example,
    make_grid,
)

# fmt: off
WORDS = (
    "river", "town", "quiet", "old", "moved", "slowly", "past", "under", "over", "light", "dark", "morning",
    "evening", "house", "garden", "stone", "bridge", "walked", "spoke", "letter", "window", "mother",
    "captain", "ship", "harbour", "winter", "summer", "field", "road", "forest", "candle", "table", "door",
    "night", "heard", "voice", "looked", "long", "little", "great", "never", "always", "before", "after",
)
# fmt: on
MAGIC = re.compile(r"The special magic number for (\S+) is: (\d+)\.")
ASSIGNMENT = re.compile(r"VAR ([A-Z]+) = (?:(\d+)|VAR ([A-Z]+))\.")


def prose(rng: random.Random, paragraphs: int) -> str:
    """Sentences of random words, with . ! ? endings and paragraph breaks; no digits."""
    out = []
    for _ in range(paragraphs):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))).capitalize() + rng.choice(".!?")
            for _ in range(rng.randint(2, 6))
        ]
        out.append(" ".join(sentences))
    return "\n\n".join(out)


@pytest.fixture(scope="module")
def haystack() -> list[HaystackDoc]:
    rng = random.Random(1234)
    return [HaystackDoc(f"books/doc{i}", prose(rng, rng.randint(40, 120))) for i in range(8)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory, haystack: list[HaystackDoc]) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    extra = ["The special magic number for amber-falcon is: 1234567. VAR ABCDE = VAR FGHIJ. Answer: 42"] * 20
    train_bpe([d.text for d in haystack] + extra, 512, path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file: Path) -> Tokenizer:
    return load_tokenizer(tokenizer_file)


def relative_position(example: Example, char_offset: int) -> float:
    """Where a character of the prompt lies in the context, as a fraction of the context's characters."""
    return (char_offset - example.context_offset) / len(example.context)


def check_needles(example: Example, tokenizer) -> None:
    """Independent checks of every recorded needle against the prompt and its re-tokenization."""
    prompt = example.prompt
    assert prompt[example.context_offset : example.context_offset + len(example.context)] == example.context
    encoding = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(encoding.ids) == example.prompt_tokens
    previous = -1
    for needle in example.needles:
        assert prompt[needle.char_offset : needle.char_offset + len(needle.text)] == needle.text
        assert example.context_offset <= needle.char_offset < example.context_offset + len(example.context)
        assert needle.char_offset > previous  # in order of appearance
        previous = needle.char_offset
        start, end = encoding.offsets[needle.token_offset]
        assert start <= needle.char_offset < end  # the token holds the needle's first character
        n = len(tokenizer.encode(needle.text, add_special_tokens=False).ids)
        decoded = tokenizer.decode(encoding.ids[needle.token_offset : needle.token_offset + n + 2])
        assert needle.text in decoded and decoded.index(needle.text) <= 1  # at most the whitespace before it
        assert needle.text not in tokenizer.decode(encoding.ids[: needle.token_offset])
        assert 0.0 <= needle.depth <= 1.0


@pytest.mark.parametrize("kind", TASK_KINDS)
@pytest.mark.parametrize("depth", [0.0, 0.35, 1.0])
def test_needles_offsets_and_budget(haystack, tokenizer, kind, depth) -> None:
    budget = 1024
    example = build_example(haystack, tokenizer, budget, depth, seed=11, kind=kind)
    check_needles(example, tokenizer)
    n_tokens = len(tokenizer.encode(example.prompt, add_special_tokens=False).ids)
    assert 0.9 * budget <= n_tokens <= budget
    assert example.prompt.endswith("\nAnswer:") and example.question in example.prompt
    assert example.context_tokens == budget and example.depth == depth and example.kind == kind
    assert set(example.haystack_ids) <= {d.id for d in haystack}


@pytest.mark.parametrize("kind", ["single_needle", "multi_key", "variable_tracking"])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_asked_needle_sits_at_the_requested_depth(haystack, tokenizer, kind, depth) -> None:
    example = build_example(haystack, tokenizer, 2048, depth, seed=5, kind=kind)
    asked = next(
        n for n in example.needles if n.target
    )  # for variable tracking: the chain's first assignment
    assert abs(relative_position(example, asked.char_offset) - depth) <= 0.1
    assert abs(asked.depth - depth) <= 0.1
    if depth == 0.0:
        assert (
            example.needles[0] == asked and asked.char_offset == example.context_offset and asked.depth == 0.0
        )
    if depth == 1.0:
        assert asked.depth == 1.0 and example.context.endswith(
            asked.text if kind != "variable_tracking" else "."
        )


def test_training_text_keeps_the_prompt_tokens(haystack, tokenizer) -> None:
    example = build_example(haystack, tokenizer, 800, 0.5, seed=3, kind="multi_value")
    prompt_ids = tokenizer.encode(example.prompt, add_special_tokens=False).ids
    doc_ids = tokenizer.encode(example.training_text, add_special_tokens=False).ids
    assert example.training_text == example.prompt + " " + example.answer
    assert doc_ids[: len(prompt_ids)] == prompt_ids  # needle token offsets hold in the document too


def test_deterministic_by_seed(haystack, tokenizer) -> None:
    for kind in TASK_KINDS:
        a = build_example(haystack, tokenizer, 700, 0.4, seed=99, kind=kind)
        assert build_example(haystack, tokenizer, 700, 0.4, seed=99, kind=kind) == a
        b = build_example(haystack, tokenizer, 700, 0.4, seed=100, kind=kind)
        assert b.prompt != a.prompt and b.answer != a.answer
    # global RNG state plays no part
    random.seed(0)
    x = build_example(haystack, tokenizer, 700, 0.4, seed=1, kind="multi_key")
    random.seed(12345)
    assert build_example(haystack, tokenizer, 700, 0.4, seed=1, kind="multi_key") == x


@pytest.mark.parametrize("seed", range(4))
def test_multi_key_answers_the_asked_key_only(haystack, tokenizer, seed) -> None:
    sizes = TaskSizes(keys=5)
    example = build_example(haystack, tokenizer, 1200, 0.6, seed=seed, kind="multi_key", sizes=sizes)
    found = MAGIC.findall(example.context)
    keys = dict(found)
    assert len(found) == len(keys) == 5  # distinct keys, one needle each
    asked = re.search(r"number for (\S+) mentioned", example.question).group(1)
    assert keys[asked] == example.answer
    assert all(
        v != example.answer for k, v in keys.items() if k != asked
    )  # distractors present, other values
    assert [n.target for n in example.needles].count(True) == 1
    assert re.fullmatch(r"\d{7}", example.answer)


@pytest.mark.parametrize("seed", range(4))
def test_multi_value_lists_all_values_in_order(haystack, tokenizer, seed) -> None:
    example = build_example(
        haystack, tokenizer, 1200, 0.3, seed=seed, kind="multi_value", sizes=TaskSizes(values=3)
    )
    found = MAGIC.findall(example.context)
    key = re.search(r"numbers for (\S+) mentioned", example.question).group(1)
    values = [v for k, v in found if k == key]
    assert len(found) == len(values) == 3 and len(set(values)) == 3
    assert example.answer.split(", ") == values
    assert all(n.target for n in example.needles)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_variable_tracking_answer_is_the_chain(haystack, tokenizer, seed, depth) -> None:
    sizes = TaskSizes(hops=5, chains=3)
    example = build_example(
        haystack, tokenizer, 1500, depth, seed=seed, kind="variable_tracking", sizes=sizes
    )
    env: dict[str, str] = {}
    order: list[str] = []
    for name, number, source in ASSIGNMENT.findall(example.context):  # run the context as a program
        env[name] = number or env[source]
        order.append(name)
    assert len(order) == len(set(order)) == 15
    asked = re.search(r"assigned the value (\d+),", example.question).group(1)
    assert example.answer.split(", ") == [name for name in order if env[name] == asked]
    assert len(example.answer.split(", ")) == 5
    assert sum(n.target for n in example.needles) == 5


def test_haystack_comes_from_the_recorded_documents(haystack, tokenizer) -> None:
    example = build_example(haystack, tokenizer, 4096, 0.5, seed=8, kind="single_needle")
    assert len(example.haystack_ids) >= 2  # the budget needs more than one small document
    texts = {d.id: d.text for d in haystack}
    body = example.context.replace(example.needles[0].text, "")
    for doc_id in example.haystack_ids:
        assert any(len(line) > 40 and line in texts[doc_id] for line in re.split(r"\n+|[.!?] ", body))
    for line in (s for s in re.split(r"\n+|[.!?] ", body) if len(s) > 40):
        assert any(line in texts[i] for i in example.haystack_ids)


def test_plain_texts_and_errors(haystack, tokenizer) -> None:
    texts = [d.text for d in haystack]
    example = build_example(texts + [""], tokenizer, 600, 0.5, seed=2, kind="single_needle")
    assert set(example.haystack_ids) <= {str(i) for i in range(len(texts))}
    with pytest.raises(ValueError, match="unknown task kind"):
        build_example(texts, tokenizer, 600, 0.5, 2, "needle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth"):
        build_example(texts, tokenizer, 600, 1.5, 2, "single_needle")
    with pytest.raises(ValueError, match="no room"):
        build_example(texts, tokenizer, 40, 0.5, 2, "variable_tracking")
    with pytest.raises(ValueError, match="haystack documents hold"):
        build_example([texts[0][:2000]], tokenizer, 4096, 0.5, 2, "single_needle")
    with pytest.raises(ValueError, match="no haystack text"):
        build_example(["", ""], tokenizer, 600, 0.5, 2, "single_needle")
    with pytest.raises(ValueError, match="at least 1"):
        TaskSizes(keys=0)


def test_make_grid(haystack, tokenizer) -> None:
    lengths, depths = [512, 1024], [0.0, 0.5, 1.0]
    grid = make_grid([d.text for d in haystack], tokenizer, lengths, depths, seed=4, kind="single_needle")
    assert [(e.context_tokens, e.depth) for e in grid] == [(n, d) for n in lengths for d in depths]
    for example in grid:
        check_needles(example, tokenizer)
        assert 0.9 * example.context_tokens <= example.prompt_tokens <= example.context_tokens
    # within one length only the needle's place changes
    assert len({e.answer for e in grid[:3]}) == 1 and len({e.haystack_ids for e in grid[:3]}) == 1
    assert grid[0].answer != grid[3].answer
    assert (
        make_grid([d.text for d in haystack], tokenizer, lengths, depths, seed=4, kind="single_needle")
        == grid
    )


# --- the datatrove stage and the curated layout ---------------------------------------------


def curated_docs(haystack: list[HaystackDoc]) -> list[Document]:
    docs = [Document(text=d.text, id=d.id, metadata={"source": "books", "token_count": 1}) for d in haystack]
    # an earlier synthetic document among the inputs is never used as haystack
    docs.append(Document(text="IGNORED " * 500, id="synthetic/old", metadata={"source": "synthetic"}))
    return docs


def run_stage(step: SyntheticTasks, haystack, rank: int = 0, world_size: int = 1) -> list[Document]:
    return list(step.run(iter(curated_docs(haystack)), rank=rank, world_size=world_size))


def as_records(docs: list[Document]) -> dict[str, tuple[str, dict]]:
    """Text and metadata by id, without the ``file_path`` that datatrove's readers add, nor the null
    ``token_ids`` and dependency score columns they read back from documents written without them."""
    return {
        d.id: (
            d.text,
            {
                k: v
                for k, v in d.metadata.items()
                if k != "file_path" and not (k in ("token_ids", *SCORE_COLUMNS) and v is None)
            },
        )
        for d in docs
    }


def test_stage_emits_documents_with_consistent_metadata(haystack, tokenizer, tokenizer_file) -> None:
    step = SyntheticTasks(tokenizer_file, n_examples=3, context_tokens=[512, 768], seed=7)
    docs = run_stage(step, haystack)
    assert len(docs) == 3 * len(DEFAULT_KINDS)  # the retrieval kinds, unless kinds says otherwise
    types = {k: type(v) for k, v in docs[0].metadata.items()}
    assert set(types) == {
        "source",
        "task",
        "answer",
        "question",
        "needle_positions",
        "needle_depths",
        "needle_is_target",
        "depth",
        "context_tokens",
        "prompt_tokens",
        "haystack_ids",
        "token_count",
    }
    for doc in docs:
        meta = doc.metadata
        assert {k: type(v) for k, v in meta.items()} == types
        assert all(isinstance(p, int) for p in meta["needle_positions"]) and meta["needle_positions"]
        assert all(isinstance(d, float) for d in meta["needle_depths"])
        assert (
            all(isinstance(i, str) for i in meta["haystack_ids"])
            and "synthetic/old" not in meta["haystack_ids"]
        )
        assert meta["source"] == "synthetic" and meta["context_tokens"] in (512, 768)
        assert re.fullmatch(rf"synthetic/{meta['task']}/7/\d", doc.id)
        assert doc.text.endswith("\nAnswer: " + meta["answer"]) and "IGNORED" not in doc.text
        ids = tokenizer.encode(doc.text, add_special_tokens=False).ids
        assert meta["token_count"] == len(ids) and meta["prompt_tokens"] <= meta["context_tokens"]
        for position, _target in zip(meta["needle_positions"], meta["needle_is_target"]):
            window = tokenizer.decode(ids[position : position + 12])
            assert window.lstrip().startswith(("The special magic", "VAR "))
    assert sorted({d.metadata["task"] for d in docs}) == sorted(DEFAULT_KINDS)
    assert as_records(run_stage(step, haystack)) == as_records(docs)  # deterministic
    other = SyntheticTasks(tokenizer_file, n_examples=3, context_tokens=[512, 768], seed=8)
    assert not {d.text for d in run_stage(other, haystack)} & {d.text for d in docs}


def test_stage_ranks_are_disjoint(haystack, tokenizer_file) -> None:
    step = SyntheticTasks(
        tokenizer_file,
        n_examples=5,
        context_tokens=512,
        kinds=["single_needle", "multi_key"],
        depths=[0.0, 1.0],
        seed=3,
    )
    rank0, rank1 = run_stage(step, haystack, 0, 2), run_stage(step, haystack, 1, 2)
    assert len(rank0) == 6 and len(rank1) == 4
    assert not {d.id for d in rank0} & {d.id for d in rank1}
    assert not {d.text for d in rank0} & {d.text for d in rank1}
    # with the same haystack, sharding changes nothing about the examples themselves
    assert as_records(rank0) | as_records(rank1) == as_records(run_stage(step, haystack))
    assert {d.metadata["depth"] for d in rank0 + rank1} <= {0.0, 1.0}
    with pytest.raises(ValueError, match="no haystack documents"):
        list(step.run(iter([]), rank=0, world_size=1))
    assert list(step.run(iter([]), rank=7, world_size=8)) == []  # nothing to build: input untouched


def test_written_documents_are_a_curated_source(tmp_path, haystack, tokenizer, tokenizer_file) -> None:
    step = SyntheticTasks(tokenizer_file, n_examples=2, context_tokens=600, seed=1)
    docs = run_stage(step, haystack)
    path = write_synthetic_documents(docs, tmp_path / "out", rank=3)
    assert path == tmp_path / "out" / "documents" / "synthetic" / "00003.parquet" and path.is_file()
    read = list(ParquetReader(str(tmp_path / "out" / "documents"), recursive=True).run())
    assert len(read) == len(docs) and all(d.metadata["source"] == "synthetic" for d in read)
    assert as_records(read) == as_records(docs)
    catalog = read_catalog(tmp_path / "out" / "documents")["synthetic"]
    assert catalog.counts_known and sorted(catalog.token_counts.tolist()) == sorted(
        d.metadata["token_count"] for d in docs
    )
    with pytest.raises(ValueError, match="not 'synthetic'"):
        write_synthetic_documents(
            [Document(text="x", id="b", metadata={"source": "books"})], tmp_path / "other"
        )
    # an example built directly becomes the same kind of document
    example = build_example(haystack, tokenizer, 600, 0.5, 1, "single_needle")
    doc = example_document(example, tokenizer, "synthetic/custom/0")
    assert doc.metadata["needle_positions"] == [example.needles[0].token_offset]


def test_pipeline_with_an_executor(tmp_path, haystack, tokenizer_file) -> None:
    out = tmp_path / "out"
    books = out / "documents" / "books"
    for rank, part in enumerate((haystack[:4], haystack[4:])):
        with DocumentWriter(books) as writer:
            for d in part:
                writer.write(
                    Document(text=d.text, id=d.id, metadata={"source": "books", "token_count": 1}), rank
                )
    step = SyntheticTasks(
        tokenizer_file, n_examples=3, context_tokens=512, kinds=["single_needle", "variable_tracking"]
    )
    LocalPipelineExecutor(
        synthetic_pipeline(out, step), tasks=2, workers=1, logging_dir=str(tmp_path / "logs")
    ).run()
    files = sorted(p.name for p in (out / "documents" / "synthetic").iterdir())
    assert files == ["00000.parquet", "00001.parquet"]
    docs = list(ParquetReader(str(out / "documents" / "synthetic")).run())
    assert len(docs) == 6 and len({d.id for d in docs}) == 6
    by_rank = {d.id: set(d.metadata["haystack_ids"]) for d in docs}
    first, second = {d.id for d in haystack[:4]}, {d.id for d in haystack[4:]}
    for doc_id, used in by_rank.items():  # each rank hides needles in its own share of the files
        index = int(doc_id.rsplit("/", 1)[1])
        assert used <= (first if index % 2 == 0 else second)


def test_books_from_the_shared_corpus(shared_corpus, tokenizer) -> None:
    names = [
        "aimacode__aima-data__flatland.txt",
        "patrickmineault__zipf__dracula.txt",
        "karpathy__char-rnn__input.txt",
    ]
    books = [HaystackDoc(f"books/{n}", read_text_file(shared_corpus / "books" / n)) for n in names]
    grid = make_grid(books, tokenizer, [2048, 8192], [0.0, 0.5, 1.0], seed=0, kind="single_needle")
    for example in grid:
        check_needles(example, tokenizer)
        assert 0.9 * example.context_tokens <= example.prompt_tokens <= example.context_tokens
        assert abs(relative_position(example, example.needles[0].char_offset) - example.depth) <= 0.1
        assert set(example.haystack_ids) <= {b.id for b in books}
    for kind in ("multi_key", "variable_tracking"):
        example = build_example(books, tokenizer, 4096, 0.5, seed=1, kind=kind)
        check_needles(example, tokenizer)

"""The model-based dependency score (``curate.dependency.model``, :mod:`longctx.pipeline.dependency_model`).

The model is a tiny one-layer Llama trained by longctx (curate, pack, train: 300 steps, 15-65 s on two
busy cores, once per module; the tests that need it are marked slow) to continue a text whose second
half repeats its first (:mod:`tests.pipeline.copy_model`), so that what it gains from distant text is
known: documents whose second half refers back to the first (a copy with a fifth of its words changed)
must outscore the same halves joined from unrelated documents. The references are computed here: the
AUC by counting pairs, each segment's loss by transformers' own loss on the whole view. The refusals
need no trained model.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from datatrove.data import Document  # noqa: E402

from longctx import jobs  # noqa: E402
from longctx.cli import main  # noqa: E402
from longctx.config import parse_config  # noqa: E402
from longctx.core.config import TokenizerConfig  # noqa: E402
from longctx.core.errors import ConfigError  # noqa: E402
from longctx.core.tokenizer import resolve_tokenizer  # noqa: E402
from longctx.pipeline.config import CurateConfig  # noqa: E402
from longctx.pipeline.dependency_model import (  # noqa: E402
    METADATA_KEY,
    DependencyModelScore,
    check_dependency_model,
    document_views,
    relative_fall,
    score_documents,
    segment_losses,
    segment_starts,
)
from tests.pipeline.copy_model import (  # noqa: E402
    DEPENDENCY,
    HALF,
    SETTINGS,
    WORDS,
    auc,
    edited,
    save_word_tokenizer,
    text,
    train_copy_model,
)


def llama_config(max_positions: int = 256) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=len(WORDS) + 1,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=len(WORDS),
        pad_token_id=None,
    )


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model trained by longctx (:func:`~tests.pipeline.copy_model.train_copy_model`)."""
    work = tmp_path_factory.mktemp("copy_model")
    return train_copy_model(work, save_word_tokenizer(work / "tokenizer"))


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained model of the same shape, with its tokenizer: for what needs no behaviour."""
    folder = tmp_path_factory.mktemp("random_model")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(llama_config()).save_pretrained(folder)
    save_word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(copy_model: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(copy_model).eval()


def test_segments_sit_where_the_whole_context_precedes_them() -> None:
    long_doc = np.arange(1000)
    starts = segment_starts(len(long_doc), SETTINGS)
    assert starts == [96, 392, 688, 984]
    for (short, long), start in zip(document_views(long_doc, SETTINGS, bos=None), starts, strict=True):
        assert short.tolist() == list(range(start - 16, start + 16))
        assert long.tolist() == list(range(start - 96, start + 16))
    # shorter than context + segment: its last segment, with everything before it
    assert segment_starts(100, SETTINGS) == [84]
    short, long = document_views(np.arange(100), SETTINGS, bos=7)[0]
    assert short.tolist() == [7, *range(68, 100)] and long.tolist() == [7, *range(100)]
    # no text beyond the local context: nothing to score, a score of 0
    assert segment_starts(32, SETTINGS) == [] and segment_starts(33, SETTINGS) == [17]
    assert relative_fall([], []) == 0.0
    assert relative_fall([2.0, 4.0], [1.0, 2.0]) == pytest.approx(0.5)


@pytest.mark.slow
def test_segment_losses_are_the_models_loss_on_each_segment(loaded) -> None:
    """Batched views with logits for the segments only give transformers' loss on each whole view
    with every other token masked."""
    rng = np.random.default_rng(3)
    views = [rng.integers(0, len(WORDS), n) for n in (32, 112, 112, 50, 112, 32, 32)]
    losses = segment_losses(loaded, views, SETTINGS, "cpu")
    for view, loss in zip(views, losses, strict=True):
        ids = torch.from_numpy(view)[None]
        labels = ids.clone()
        labels[:, : -SETTINGS.segment] = -100
        with torch.no_grad():
            reference = loaded(input_ids=ids, labels=labels).loss.item()
        assert loss == pytest.approx(reference, rel=1e-4)


@pytest.mark.slow
def test_documents_that_refer_back_score_higher(loaded) -> None:
    """32 documents whose second half edits their first against the same halves joined across
    documents: AUC of at least 0.9."""
    rng = np.random.default_rng(7)
    firsts = [rng.integers(0, len(WORDS), HALF) for _ in range(32)]
    seconds = [edited(rng, first) for first in firsts]
    referring = [np.concatenate([firsts[i], seconds[i]]) for i in range(32)]
    unrelated = [np.concatenate([firsts[(i + 1) % 32], seconds[i]]) for i in range(32)]
    positives = score_documents(loaded, referring, SETTINGS, "cpu", None)
    negatives = score_documents(loaded, unrelated, SETTINGS, "cpu", None)
    assert auc(positives, negatives) >= 0.9
    # the model copies what it reads 64 tokens back: from an unrelated half, confidently wrong
    assert min(positives) > 0 > max(negatives)


@pytest.mark.slow
def test_the_same_text_repeated_scores_the_same_whatever_its_length(loaded) -> None:
    """Documents that refer back (a half, then the half edited) and the same documents repeated 2, 3 and
    5 times: per token the text depends on what precedes it as much at every length, and so does the
    score (a sum over segments would grow with the length; a mean over segments without their whole
    context would too, as they become a smaller part of it)."""
    rng = np.random.default_rng(11)
    texts = []
    for _ in range(16):
        first = rng.integers(0, len(WORDS), HALF)
        texts.append(np.concatenate([first, edited(rng, first)]))
    means = {
        times: float(
            np.mean(score_documents(loaded, [np.tile(t, times) for t in texts], SETTINGS, "cpu", None))
        )
        for times in (1, 2, 3, 5)
    }
    assert min(means.values()) > 0.5
    assert max(means.values()) - min(means.values()) < 0.08, means


@pytest.mark.slow
def test_the_models_tokenizer_and_the_runs_ids_give_the_same_scores(copy_model: Path, tmp_path: Path) -> None:
    """A model folder without a tokenizer reads the run's ids (``token_ids``) or encodes the text with
    the run's tokenizer; with one it reads the text: the same scores here, where both are one."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(copy_model / name, bare / name)
    rng = np.random.default_rng(5)
    firsts = [rng.integers(0, len(WORDS), HALF) for _ in range(3)]
    ids = [np.concatenate([f, edited(rng, f)]) for f in firsts]

    def documents(with_ids: bool) -> list[Document]:
        return [
            Document(text=text(d), id=str(i), metadata={"token_ids": d.astype(np.uint32)} if with_ids else {})
            for i, d in enumerate(ids)
        ]

    own = DependencyModelScore(copy_model, SETTINGS, device="cpu")
    run = DependencyModelScore(bare, SETTINGS, device="cpu", run_tokenizer=copy_model / "tokenizer.json")
    scores = [
        [doc.metadata[METADATA_KEY] for doc in step.run(documents(with_ids))]
        for step, with_ids in ((own, False), (run, True), (run, False))
    ]
    assert scores[0] == scores[1] == scores[2]
    assert all(score > 0.5 for score in scores[0])


def curate_config(**dependency) -> CurateConfig:
    return CurateConfig.model_validate({"dependency": dependency})


def write_config(folder: Path, max_positions: int = 256) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    llama_config(max_positions).save_pretrained(folder)
    return folder


def _missing(tmp: Path) -> str:
    return str(tmp / "nowhere")


def _a_file(tmp: Path) -> str:
    (tmp / "model.txt").write_text("weights?")
    return str(tmp / "model.txt")


def _no_config(tmp: Path) -> str:
    (tmp / "empty").mkdir()
    return str(tmp / "empty")


def _not_json(tmp: Path) -> str:
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_text("{model_type: llama")
    return str(tmp / "m")


def _not_causal(tmp: Path) -> str:
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    return str(tmp / "m")


def _own_code(tmp: Path) -> str:
    (tmp / "m").mkdir()
    config = {"model_type": "my_arch", "auto_map": {"AutoModelForCausalLM": "modeling_my.MyModel"}}
    (tmp / "m" / "config.json").write_text(json.dumps(config))
    (tmp / "m" / "modeling_my.py").write_text("raise SystemExit('never run')\n")
    return str(tmp / "m")


def _pickle_weights(tmp: Path) -> str:
    folder = write_config(tmp / "m")
    (folder / "pytorch_model.bin").write_bytes(b"not unpickled")
    return str(folder)


def _no_weights(tmp: Path) -> str:
    return str(write_config(tmp / "m"))


def _bad_tokenizer(tmp: Path) -> str:
    folder = write_config(tmp / "m")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{not a tokenizer")
    return str(folder)


def _hub_id_not_cached(tmp: Path) -> str:
    return "longctx-tests/no-such-model"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_missing, "does not exist"),
        (_a_file, "is a file, not a model folder"),
        (_no_config, "has no config.json"),
        (_not_json, "is not valid JSON"),
        (_not_causal, "model_type 't5' is not a causal LM architecture"),
        (_own_code, "auto_map names code in the folder, which curation never runs"),
        (_pickle_weights, "holds only pickle weights (pytorch_model.bin)"),
        (_no_weights, "holds no weights"),
        (_bad_tokenizer, "cannot be loaded"),
        (_hub_id_not_cached, "curation downloads nothing"),
    ],
)
def test_a_bad_model_is_refused_in_one_line(make, says: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        check_dependency_model(curate_config(model=make(tmp_path)), TokenizerConfig(), None)
    message = str(refused.value)
    assert message.startswith("curate.dependency.model: ") and "\n" not in message
    assert says in message


def test_missing_transformers_is_refused_in_one_line(monkeypatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    with pytest.raises(ConfigError) as refused:
        check_dependency_model(curate_config(model=str(tmp_path)), TokenizerConfig(), None)
    assert str(refused.value) == (
        "curate.dependency.model: needs the transformers package, which is not installed: "
        "pip install 'longctx[transformers]'"
    )


def test_settings_the_model_cannot_serve_are_refused_in_one_line(random_model: Path, tmp_path: Path) -> None:
    short = write_config(tmp_path / "short", max_positions=100)
    shutil.copy(random_model / "model.safetensors", short)
    cases = [
        ({"model": str(short), "model_context_tokens": 96}, "curate.dependency.model_context_tokens: 96"),
        ({"model": str(short), "model_segment_tokens": 99}, "curate.dependency.model_segment_tokens: 99"),
        (
            {"model": str(random_model), "model_context_tokens": 64, "model_local_tokens": 64},
            "curate.dependency.model_local_tokens: 64 is not below",
        ),
        # no tokenizer in the folder, and the run's (trained, 4096 tokens) has more than its 65 embeddings
        (
            {"model": str(short), "model_segment_tokens": 16, "model_local_tokens": 16},
            f"curate.dependency.model: {short} has no tokenizer",
        ),
    ]
    if not torch.cuda.is_available():
        cases.append(
            (
                {"model": str(random_model), **DEPENDENCY, "model_device": "cuda"},
                "curate.dependency.model_device: cuda",
            )
        )
    for dependency, says in cases:
        with pytest.raises(ConfigError) as refused:
            check_dependency_model(curate_config(**dependency), TokenizerConfig(), None)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    # the default context fits the model's positions: 100 - 16 - 1 (a BOS token)
    check_dependency_model(
        curate_config(model=str(short), model_segment_tokens=16, model_local_tokens=16),
        TokenizerConfig(path=str(random_model)),
        resolve_tokenizer(str(random_model)),
    )


def test_curate_refuses_a_missing_model_before_writing(tmp_path: Path, random_model: Path, capsys) -> None:
    (tmp_path / "input" / "books").mkdir(parents=True)
    (tmp_path / "input" / "books" / "a.txt").write_text(text(np.arange(64) % 64))
    config = {
        "output": str(tmp_path / "run"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(random_model)},
        "curate": {"input": str(tmp_path / "input"), "dependency": {"model": str(tmp_path / "nowhere")}},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["curate", "--config", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("longctx curate: curate.dependency.model: ") and "\n" not in err
    assert not list((tmp_path / "run").rglob("run.json"))


def _documents(output: Path) -> dict[str, dict]:
    rows = {}
    for file in sorted((output / "documents").rglob("*.parquet")):
        for row in pq.read_table(file).to_pylist():
            rows[row["id"]] = row
    return rows


@pytest.mark.slow
def test_curate_stores_the_scores_and_resumes_to_the_same(tmp_path: Path, copy_model: Path, loaded) -> None:
    """``curate`` with a model: every kept document carries its score, the one the step computes
    alone; a run whose read and write tasks 1 were lost redoes them to the same documents."""
    rng = np.random.default_rng(21)
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    refers_back = {}
    for i in range(8):
        first, other = rng.integers(0, len(WORDS), (2, HALF))
        refers = i % 2 == 0
        ids = np.concatenate([first, edited(rng, first if refers else other)])
        (books / f"book{i}.txt").write_text(text(ids) + "\n")
        refers_back[f"book{i}.txt"] = refers
    config = {
        "output": str(tmp_path / "run"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(copy_model)},
        "curate": {
            "input": str(tmp_path / "input"),
            "min_fraction_of_target": 0.25,
            "dependency": {"model": str(copy_model), **DEPENDENCY},
            "executor": {"tasks": 2, "workers": 2},
        },
    }
    cfg = parse_config(config)
    jobs.curate(cfg)
    documents = _documents(tmp_path / "run")
    assert len(documents) == 8
    for row in documents.values():
        metadata = json.loads(row["metadata"])
        ids = np.asarray(row["token_ids"], dtype=np.int64)
        score = row[METADATA_KEY]  # a column of its own beside the text (pipeline/documents.py)
        assert score == pytest.approx(score_documents(loaded, [ids], SETTINGS, "cpu", None)[0], abs=1e-5)
        assert (score > 0) == refers_back[Path(metadata["path"]).name]

    logs = tmp_path / "run" / "work" / "curate" / "logs"
    for stage in ("read", "write"):
        (next(logs.glob(f"*_{stage}")) / "completions" / "00001").unlink()
    shutil.rmtree(next(logs.glob("*_finalize")))
    for file in (tmp_path / "run" / "documents").rglob("00001.parquet"):
        file.unlink()
    (tmp_path / "run" / "ledger.parquet").unlink()
    jobs.curate(cfg)
    assert (next(logs.glob("*_read")) / "completions" / "00001").exists()  # read task 1 scored again
    assert _documents(tmp_path / "run") == documents

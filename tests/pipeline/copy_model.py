"""A tiny model trained by longctx to continue a text whose second half repeats its first, and the
synthetic documents the model-based dependency score is checked on (``test_dependency_model.py`` and
``tests/benchmarks/bench_dependency_model.py``).

Texts are words of a 64-word vocabulary (no digits: curation's MinHash folds numbered words into one),
one token each in a word-level tokenizer. The model learns that a token 64 positions back predicts the
next one, so what it gains from distant text is known.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from longctx import jobs
from longctx.config import parse_config
from longctx.pipeline.dependency_model import ScoreSettings
from tests.pipeline.dependency_cases import auc  # noqa: F401 - re-exported for the model score's tests

WORDS = [a + b for a in "bcdfghkl" for b in "aeiouymn"]
EOS = "</s>"
HALF = 64
"""Tokens in each half of a document: the distance the model learns to copy from."""
SETTINGS = ScoreSettings(segment=16, local=16, context=96, segments=4, batch_size=8)
"""Segments of the second half; the long view reaches back past the half's start, the short one does not."""
DEPENDENCY = {
    "model_segment_tokens": SETTINGS.segment,
    "model_local_tokens": SETTINGS.local,
    "model_context_tokens": SETTINGS.context,
    "model_segments": SETTINGS.segments,
    "model_batch_size": SETTINGS.batch_size,
    "model_device": "cpu",
}
""":data:`SETTINGS` as ``curate.dependency``'s keys (with ``model``: a whole section)."""


def save_word_tokenizer(folder: Path) -> Path:
    """The 64 words and an EOS token, saved as transformers saves a tokenizer; returns the folder."""
    import transformers

    vocab = {word: i for i, word in enumerate(WORDS)} | {EOS: len(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([EOS])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS).save_pretrained(folder)
    return folder


def text(ids: np.ndarray) -> str:
    return " ".join(WORDS[i] for i in ids)


def edited(rng: np.random.Generator, ids: np.ndarray, share: float = 0.2) -> np.ndarray:
    """``ids`` with about ``share`` of its tokens redrawn: a text that refers back to ``ids``."""
    out = ids.copy()
    changed = rng.random(len(ids)) < share
    out[changed] = rng.integers(0, len(WORDS), int(changed.sum()))
    return out


def write_books(folder: Path, documents: dict[str, np.ndarray]) -> None:
    """One book ``<name>.txt`` per document."""
    folder.mkdir(parents=True)
    for name, ids in documents.items():
        (folder / f"{name}.txt").write_text(text(ids) + "\n")


def train_copy_model(work: Path, tokenizer: Path, *, documents: int = 400, steps: int = 300) -> Path:
    """Curate, pack and train with longctx (``work/copy_run``) a one-layer tiny Llama on ``documents``
    texts whose second half repeats the first, windows of 256 tokens, 8 a step; its final model folder
    (with the run's tokenizer ``tokenizer``, which the export writes beside it)."""
    rng = np.random.default_rng(0)
    firsts = rng.integers(0, len(WORDS), (documents, HALF))
    write_books(work / "copy_input" / "books", {f"t{i:04d}": np.tile(f, 2) for i, f in enumerate(firsts)})
    config = {
        "output": str(work / "copy_run"),
        "context": {"original": 128, "target": 256},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(work / "copy_input"), "min_fraction_of_target": 0.25},
        "pack": {"seq_lens": [256]},
        "train": {
            "model": {
                "tiny": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 2,
                }
            },
            "steps": steps,
            "global_batch_rows": 8,
            "holdout_rows": 0,
            "precision": "fp32",
            "optim": {"lr": 0.01, "warmup_steps": 10, "min_lr_ratio": 0.1, "weight_decay": 0.0},
            "checkpoint": {"every": steps, "keep": 1},
            "coverage": {"allow_short": True},  # documents of 128 tokens: positions past 128 are not taught
            "log": {"every": 50},
        },
    }
    cfg = parse_config(config)
    jobs.curate(cfg)
    jobs.pack(cfg)
    jobs.train(cfg, progress=False)
    return work / "copy_run" / "train" / "final"

"""The model-based dependency score (``curate.dependency.model``) with a tiny model trained by longctx.

1. A corpus of ``--train-docs`` documents whose second half repeats the first (64 + 64 words of a
   64-word vocabulary, one token each) is curated, packed into windows of 256 tokens and trained on
   with ``longctx train`` (a one-layer tiny Llama, ``--steps`` steps of 8 windows;
   ``tests/pipeline/copy_model.py``, which the tests share).
2. ``--pairs`` evaluation documents whose second half refers back to the first (the first half with a
   fifth of its words changed) and as many of the same halves joined from unrelated documents are
   curated with ``curate.dependency.model`` set to the trained model's folder; the AUC of the stored
   scores (referring above unrelated) is counted pair by pair.
3. The scoring step alone is timed on the same documents (``--repeats`` passes, CPU, per document),
   and on documents of ``--long-tokens`` tokens with a larger random Llama (``--long-hidden``,
   ``--long-layers``) at the default view lengths (segments of 128 tokens, local context 128, context
   4096, 8 segments): what a document costs on the CPU at a realistic shape, against the baseline of
   one forward pass of the same model over the whole document (windows of 4224 tokens, 8 at once).

    python tests/benchmarks/bench_dependency_model.py
    python tests/benchmarks/bench_dependency_model.py --report results.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import transformers
from datatrove.data import Document

from longctx import jobs
from longctx.config import parse_config
from longctx.pipeline.dependency_model import METADATA_KEY, DependencyModelScore, ScoreSettings

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.pipeline.copy_model import (
    DEPENDENCY,
    HALF,
    SETTINGS,
    WORDS,
    auc,
    edited,
    save_word_tokenizer,
    text,
    train_copy_model,
    write_books,
)


def evaluation_documents(pairs: int) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    """``pairs`` documents that refer back and as many joined from unrelated halves, by name, and
    whether each refers back."""
    rng = np.random.default_rng(1)
    firsts = rng.integers(0, len(WORDS), (pairs, HALF))
    seconds = [edited(rng, first) for first in firsts]
    documents, refers = {}, {}
    for i in range(pairs):
        documents[f"refers{i:03d}"] = np.concatenate([firsts[i], seconds[i]])
        documents[f"unrelated{i:03d}"] = np.concatenate([firsts[(i + 1) % pairs], seconds[i]])
        refers[f"refers{i:03d}"], refers[f"unrelated{i:03d}"] = True, False
    return documents, refers


def curated_scores(work: Path, tokenizer: Path, model: Path, documents: dict[str, np.ndarray]) -> dict:
    """Curate ``documents`` with the model's score; each document's stored score by name."""
    write_books(work / "eval_input" / "books", documents)
    dependency = {"model": str(model), **DEPENDENCY}
    config = {
        "output": str(work / "eval_run"),
        "context": {"original": 128, "target": 256},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {
            "input": str(work / "eval_input"),
            "min_fraction_of_target": 0.25,
            "dependency": dependency,
        },
    }
    jobs.curate(parse_config(config))
    scores = {}
    for file in (work / "eval_run" / "documents").rglob("*.parquet"):
        for metadata in pq.read_table(file, columns=["metadata"]).column(0).to_pylist():
            meta = json.loads(metadata)
            scores[Path(meta["path"]).stem] = meta[METADATA_KEY]
    return scores


def step_seconds(step: DependencyModelScore, documents: list[Document]) -> float:
    """Seconds per document of one pass of ``step`` over copies of ``documents``."""
    copies = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in documents]
    start = time.perf_counter()
    list(step.run(copies))
    return (time.perf_counter() - start) / len(documents)


def long_documents_cost(work: Path, args: argparse.Namespace) -> dict:
    """Seconds per document of ``--long-tokens`` tokens with a random Llama of the ``--long-*`` shape
    at the default view lengths (segments of 128 tokens, local 128, context 4096, 8 segments)."""
    folder = work / "long_model"
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=args.long_hidden,
        intermediate_size=args.long_hidden * 8 // 3,
        num_hidden_layers=args.long_layers,
        num_attention_heads=args.long_hidden // 64,
        num_key_value_heads=max(1, args.long_hidden // 256),
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    settings = ScoreSettings(segment=128, local=128, context=4096, segments=8, batch_size=8)
    rng = np.random.default_rng(2)  # ids carried by the documents: the run's tokenizer is not used
    documents = [
        Document(text="-", id=str(i), metadata={"token_ids": rng.integers(0, 32000, args.long_tokens)})
        for i in range(args.long_docs)
    ]
    step = DependencyModelScore(
        folder, settings, device="cpu", run_tokenizer=work / "tokenizer" / "tokenizer.json"
    )
    step_seconds(step, documents[:1])  # loads the model, which the baseline then shares
    seconds, read_once = [], []
    for _ in range(args.repeats):  # interleaved: load from other programs hits both alike
        seconds.append(step_seconds(step, documents))
        read_once.append(read_once_seconds(folder, documents, settings))
    return {
        "model": {"hidden_size": args.long_hidden, "layers": args.long_layers, "parameters": parameters},
        "document_tokens": args.long_tokens,
        "documents": args.long_docs,
        "settings": settings.__dict__,
        "seconds_per_document": summary(seconds),
        "read_once_seconds_per_document": summary(read_once),
        "ratio": statistics.median(seconds) / statistics.median(read_once),
    }


def read_once_seconds(folder: Path, documents: list[Document], settings: ScoreSettings) -> float:
    """The baseline: seconds per document of one forward pass of the same model over the whole
    document, in windows of context + segment tokens, as many at once as the step batches."""
    from longctx.pipeline.causal_lm import load_causal_lm

    model = load_causal_lm(str(folder), "cpu")
    window = settings.context + settings.segment
    start = time.perf_counter()
    with torch.inference_mode():
        for document in documents:
            ids = torch.as_tensor(np.asarray(document.metadata["token_ids"], dtype=np.int64))
            windows = ids[: len(ids) // window * window].view(-1, window)
            for batch in windows.split(settings.batch_size):
                model(input_ids=batch, use_cache=False, logits_to_keep=1)
    return (time.perf_counter() - start) / len(documents)


def summary(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "repeats": len(values),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-docs", type=int, default=400, help="training documents (128 tokens each)")
    parser.add_argument("--steps", type=int, default=300, help="longctx train steps (8 windows of 256 each)")
    parser.add_argument("--pairs", type=int, default=32, help="referring / unrelated evaluation pairs")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of the scoring step")
    parser.add_argument("--long-tokens", type=int, default=32768, help="tokens of the larger documents")
    parser.add_argument("--long-docs", type=int, default=2, help="larger documents timed")
    parser.add_argument("--long-hidden", type=int, default=512, help="hidden size of the larger random Llama")
    parser.add_argument("--long-layers", type=int, default=4, help="layers of the larger random Llama")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep the runs here (default: a temp folder)"
    )
    parser.add_argument("--report", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_dependency_model_") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tokenizer = save_word_tokenizer(work / "tokenizer")
        start = time.perf_counter()
        model = train_copy_model(work, tokenizer, documents=args.train_docs, steps=args.steps)
        train_seconds = time.perf_counter() - start
        print(f"trained {model} in {train_seconds:.1f} s", flush=True)
        documents, refers = evaluation_documents(args.pairs)
        scores = curated_scores(work, tokenizer, model, documents)
        positives = [scores[name] for name in documents if refers[name]]
        negatives = [scores[name] for name in documents if not refers[name]]
        area = auc(positives, negatives)
        print(
            f"AUC {area:.3f} over {len(positives)} referring and {len(negatives)} unrelated documents; "
            f"mean score {np.mean(positives):.3f} against {np.mean(negatives):.3f}",
            flush=True,
        )
        step = DependencyModelScore(model, SETTINGS, device="cpu")  # its own tokenizer, as curate reads it
        texts = [Document(text=text(ids), id=name) for name, ids in documents.items()]
        step_seconds(step, texts[:1])  # loads the model
        small = [step_seconds(step, texts) for _ in range(args.repeats)]
        print(
            f"tiny model: {statistics.median(small) * 1e3:.2f} ms per document of 128 tokens (CPU)",
            flush=True,
        )
        long = long_documents_cost(work, args)
        print(
            f"random Llama of {long['model']['parameters'] / 1e6:.1f}M parameters: "
            f"{long['seconds_per_document']['median']:.2f} s per document of {args.long_tokens} tokens "
            f"(CPU), {long['ratio']:.2f}x one forward pass over it",
            flush=True,
        )
    report = {
        "date": datetime.date.today().isoformat(),
        "command": "python tests/benchmarks/bench_dependency_model.py " + " ".join(argv or sys.argv[1:]),
        "machine": {"processor": platform.processor() or platform.machine(), "torch_threads": args.threads},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tiny_model": {
            "trained_by": "longctx curate + pack + train",
            "train_documents": args.train_docs,
            "steps": args.steps,
            "seconds": train_seconds,
        },
        "settings": SETTINGS.__dict__,
        "auc": area,
        "referring": {"documents": len(positives), "mean": float(np.mean(positives)), "min": min(positives)},
        "unrelated": {"documents": len(negatives), "mean": float(np.mean(negatives)), "max": max(negatives)},
        "tiny_seconds_per_document": summary(small),
        "larger_model_cpu": long,
    }
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

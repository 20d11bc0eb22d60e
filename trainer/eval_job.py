"""``longctx eval`` as a function: load a model, score loss by position and the needle grid, write
JSON and PNG results under ``<output>/eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from longctx.core.atomic import write_json, write_text
from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.pipeline.documents import document_files, read_column, source_of
from longctx.trainer.config import EvalConfig, TrainConfig


def _haystack(documents: Path, limit_chars: int) -> list[str]:
    """Curated texts to hide needles in: books first, then other sources, in file order."""
    if not documents.is_dir():
        return []
    files = sorted(document_files(documents), key=lambda f: (source_of(documents, f) != "books", str(f)))
    texts, total = [], 0
    for f in files:
        for text in read_column(f, "text").to_pylist():
            texts.append(text)
            total += len(text)
            if total >= limit_chars:
                return texts
    return texts


def run_eval(
    eval: EvalConfig,
    *,
    context: ContextConfig,
    output: Path,
    train: TrainConfig | None = None,
    tokenizer: Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``eval.model`` (default: the model trained into ``output``) and return what was written.

    ``train`` is the run's training section, when it has one: its shards are the default windows to
    score, and its held-out windows are scored first. ``tokenizer`` is the configured
    ``tokenizer.path``, used when the run folder holds no ``tokenizer.json``.
    """
    from longctx.core.tokenizer import EOS_TOKEN, load_tokenizer
    from longctx.packer.dataset import PackedDataset
    from longctx.trainer.evaluate import (
        format_loss_table,
        loss_by_position,
        needle_grid,
        plot_loss_by_position,
        plot_needle_heatmap,
    )
    from longctx.trainer.hf_io import load_model
    from longctx.trainer.train import shards_folder, tokenizer_file

    layout = RunLayout(output)
    model_dir = eval.model or layout.final_model
    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"no model at {model_dir} (train first, or set eval.model to a Hugging Face checkpoint folder)"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = eval.precision == "bf16" or (eval.precision == "auto" and device.type == "cuda")
    model = load_model(model_dir, device=device)
    tok_path = tokenizer_file(layout, tokenizer)
    out = layout.eval
    trained_on = shards_folder(train, layout, context.target) if train else None
    shards = eval.shards or trained_on or layout.shard_folder(context.target)
    holdout = train.holdout_rows if train and shards == trained_on else 0
    # the held-out draw depends on the training seed: use it, so these are the rows training skipped
    seed = train.seed if train and holdout else eval.seed
    dataset = PackedDataset(shards, tokenizer=tok_path, seed=seed, holdout_rows=holdout)
    held_out = dataset.heldout_rows()[: eval.rows]
    if len(held_out) < eval.rows:
        print(
            f"warning: only {len(held_out)} held-out windows (train.holdout_rows); scoring "
            f"{eval.rows - len(held_out)} training windows too",
            flush=True,
        )
    indices = held_out + [int(i) for i in dataset.order(0)[: eval.rows - len(held_out)]]
    rows = [dataset[i] for i in indices]
    table = loss_by_position(model, rows, context.original, dataset.seq_len, device, bf16)
    write_json(
        out / "loss_by_position.json",
        {
            "model": str(model_dir),
            "shards": str(shards),
            "rows": indices,
            "held_out_rows": len(held_out),
            "buckets": table,
        },
    )
    plot_loss_by_position(
        table, context.original, out / "loss_by_position.png", f"loss by position ({model_dir.name})"
    )
    result: dict[str, Any] = {
        "loss_by_position": table,
        "loss_table": format_loss_table(table, context.original),
    }
    if eval.needle is not None:
        needle = eval.needle
        tok = load_tokenizer(tok_path)
        haystack = _haystack(layout.documents, 8 * max(needle.lengths) + 10_000)
        if not haystack:
            raise ConfigError(f"no curated documents under {layout.documents} to build needle haystacks from")
        eos = [i for i in (tok.token_to_id(EOS_TOKEN),) if i is not None]
        results = needle_grid(
            model,
            tok,
            haystack,
            needle.lengths,
            needle.depths,
            needle.kinds,
            needle.seed,
            device,
            needle.max_new_tokens,
            eos,
        )
        records = [r.__dict__ for r in results]
        accuracy = sum(r.correct for r in results) / len(results) if results else 0.0
        write_json(out / "needle.json", {"model": str(model_dir), "accuracy": accuracy, "results": records})
        plot_needle_heatmap(results, out / "needle.png")
        result["needle_accuracy"] = accuracy
    write_text(out / "loss_by_position.txt", result["loss_table"] + "\n")
    result["files"] = sorted(str(p) for p in out.iterdir() if p.suffix in (".json", ".png", ".txt"))
    return result

"""``longctx eval`` as a function: load a model, score loss by position and the needle grid, write
JSON and PNG results under ``<output>/eval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from pipeline.config import ConfigError, RootConfig
from pipeline.stats import write_json_atomic


def _haystack(documents: Path, limit_chars: int) -> list[str]:
    """Curated texts to hide needles in: books first, then other sources, in id order."""
    files = sorted(documents.glob("*/*.parquet"), key=lambda p: (p.parent.name != "books", str(p)))
    texts, total = [], 0
    for f in files:
        for text in pq.read_table(f, columns=["text"]).column("text").to_pylist():
            texts.append(text)
            total += len(text)
            if total >= limit_chars:
                return texts
    return texts


def run_eval(cfg: RootConfig) -> dict[str, Any]:
    """Evaluate ``eval.model`` (default: the trained model) and return what was written."""
    from packer import PackedDataset
    from pipeline.tokenizer import load_tokenizer
    from trainer.evaluate import (
        format_loss_table,
        loss_by_position,
        needle_grid,
        plot_loss_by_position,
        plot_needle_heatmap,
    )
    from trainer.hf_io import load_model
    from trainer.train import shards_folder, tokenizer_file

    ecfg = cfg.eval
    if ecfg is None:
        raise ConfigError("the config has no 'eval' section")
    model_dir = ecfg.model or cfg.output / "train" / "final"
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"no model at {model_dir} (train first, or set eval.model to a Hugging Face checkpoint folder)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = ecfg.precision == "bf16" or (ecfg.precision == "auto" and device.type == "cuda")
    model = load_model(model_dir, device=device)
    tok_path = tokenizer_file(cfg)
    out = cfg.output / "eval"
    shards = ecfg.shards or (shards_folder(cfg) if cfg.train else cfg.output / "shards" / f"seq{cfg.context.target}")
    holdout = cfg.train.holdout_rows if cfg.train and shards == shards_folder(cfg) else 0
    # the held-out draw depends on the training seed: use it, so these are the rows training skipped
    seed = cfg.train.seed if holdout else ecfg.seed
    dataset = PackedDataset(shards, tokenizer=tok_path, seed=seed, holdout_rows=holdout)
    held_out = dataset.heldout_rows()[: ecfg.rows]
    if len(held_out) < ecfg.rows:
        print(f"warning: only {len(held_out)} held-out windows (train.holdout_rows); scoring "
              f"{ecfg.rows - len(held_out)} training windows too", flush=True)
    indices = held_out + [int(i) for i in dataset.order(0)[: ecfg.rows - len(held_out)]]
    rows = [dataset[i] for i in indices]
    table = loss_by_position(model, rows, cfg.context.original, dataset.seq_len, device, bf16)
    write_json_atomic({"model": str(model_dir), "shards": str(shards), "rows": indices,
                       "held_out_rows": len(held_out), "buckets": table}, out / "loss_by_position.json")
    plot_loss_by_position(table, cfg.context.original, out / "loss_by_position.png", f"loss by position ({model_dir.name})")
    result: dict[str, Any] = {"loss_by_position": table, "loss_table": format_loss_table(table, cfg.context.original)}
    if ecfg.needle is not None:
        tokenizer = load_tokenizer(tok_path)
        longest = max(ecfg.needle.lengths)
        haystack = _haystack(cfg.output / "documents", 8 * longest + 10_000)
        if not haystack:
            raise ConfigError(f"no curated documents under {cfg.output / 'documents'} to build needle haystacks from")
        eos = [i for i in (tokenizer.token_to_id("<|endoftext|>"),) if i is not None]
        results = needle_grid(model, tokenizer, haystack, ecfg.needle.lengths, ecfg.needle.depths, ecfg.needle.kinds,
                              ecfg.needle.seed, device, ecfg.needle.max_new_tokens, eos)
        records = [r.__dict__ for r in results]
        accuracy = sum(r.correct for r in results) / len(results) if results else 0.0
        write_json_atomic({"model": str(model_dir), "accuracy": accuracy, "results": records}, out / "needle.json")
        plot_needle_heatmap(results, out / "needle.png")
        result["needle_accuracy"] = accuracy
    (out / "loss_by_position.txt").write_text(result["loss_table"] + "\n")
    result["files"] = sorted(str(p) for p in out.iterdir() if p.suffix in (".json", ".png", ".txt"))
    return result


def summary_json(result: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in result.items() if k != "loss_table"}, indent=2)

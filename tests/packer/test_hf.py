"""Packed batches for transformers and TRL, and shard headers through ``datasets``.

References: a transformers Llama running each document alone (logits and loss), transformers' own
``DataCollatorWithFlattening`` (flash-attention kwargs), and ``datasets``' own feature conversion.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.packer import PackedDataset, ShardError, collate_packed
from longctx.packer.format import hf_features, open_shard, shard_schema
from longctx.packer.hf import PackedCollator, read_header, to_transformers
from tests.packer.test_pack_helpers import PackedRun

transformers = pytest.importorskip("transformers")
pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


def dataset(run: PackedRun, **kwargs: object) -> PackedDataset:
    return PackedDataset(run.folder(SEQ_LEN), tokenizer=run.tokenizer_path, shuffle=False, **kwargs)


def busiest_rows(run: PackedRun, n: int = 2) -> list[dict[str, torch.Tensor]]:
    """The ``n`` windows with the most segments (several documents, padding among them)."""
    ds = dataset(run)
    return sorted((ds[i] for i in range(len(ds))), key=lambda s: -len(s["cu_seqlens"]))[:n]


def tiny_llama(attn: str, vocab: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_document_gets_the_logits_and_loss_it_gets_alone(packed_run: PackedRun, attn: str) -> None:
    samples = busiest_rows(packed_run)
    batch = collate_packed(samples)
    vocab = dataset(packed_run).shards.manifest.header.tokenizer.vocab_size
    model = tiny_llama(attn, vocab)
    with torch.no_grad():
        packed = model(**to_transformers(batch, attn))
        total, count = 0.0, 0
        for r, sample in enumerate(samples):
            cu = sample["cu_seqlens"].tolist()
            for a, b in itertools.pairwise(cu):
                ids = sample["input_ids"][a:b][None]
                alone = model(input_ids=ids, use_cache=False)  # positions 0..n-1, no other document
                assert torch.allclose(packed.logits[r, a:b], alone.logits[0], atol=1e-5, rtol=0), (
                    attn,
                    r,
                    a,
                    b,
                )
                if b - a > 1 and bool(sample["loss_mask"][a:b].any()):  # a document segment
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                    total, count = total + float(loss) * (b - a - 1), count + (b - a - 1)
    assert abs(float(packed.loss) - total / count) <= 1e-5 * total / count


def test_without_the_adapter_documents_do_see_each_other(packed_run: PackedRun) -> None:
    """The failure the adapter exists for: restarted positions alone are not enough by default."""
    sample = busiest_rows(packed_run, 1)[0]
    model = tiny_llama("sdpa", dataset(packed_run).shards.manifest.header.tokenizer.vocab_size)
    cu = sample["cu_seqlens"].tolist()
    a, b = cu[1], cu[2]
    with torch.no_grad():
        naive = model(input_ids=sample["input_ids"][None], position_ids=sample["position_ids"][None]).logits
        alone = model(input_ids=sample["input_ids"][a:b][None], use_cache=False).logits
    assert (naive[0, a:b] - alone[0]).abs().max() > 1e-3


def test_flash_kwargs_equal_transformers_flattening_collator(packed_run: PackedRun) -> None:
    samples = busiest_rows(packed_run)
    batch = collate_packed(samples)
    ours = to_transformers(batch, "flash_attention_2")
    examples = []  # every segment as its own example, as DataCollatorWithFlattening takes them
    for sample in samples:
        cu = sample["cu_seqlens"].tolist()
        examples += [{"input_ids": sample["input_ids"][a:b].tolist()} for a, b in itertools.pairwise(cu)]
    theirs = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        examples, return_tensors="pt"
    )
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(ours[key].to(torch.int64), theirs[key].to(torch.int64)), key
    assert ours["max_length_q"] == ours["max_length_k"] == theirs["max_length_q"]
    # the same labels, except that padding is never a target here
    padding = torch.cat([s["labels"] == -100 for s in samples])[None] & (ours["labels"] == -100)
    assert torch.equal(ours["labels"][~padding], theirs["labels"][~padding])
    assert ours["labels"].shape == theirs["labels"].shape and ours["use_cache"] is False


def test_unknown_attention_implementation_is_refused(packed_run: PackedRun) -> None:
    with pytest.raises(ValueError, match="keep documents apart on flash_attention_2"):
        to_transformers(collate_packed(busiest_rows(packed_run, 1)), "paged|sdpa")


@pytest.mark.slow
def test_a_short_transformers_trainer_run_trains(packed_run: PackedRun, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    ds = dataset(packed_run)
    model = tiny_llama("sdpa", ds.shards.manifest.header.tokenizer.vocab_size).train()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=30,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        remove_unused_columns=False,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=ds, data_collator=PackedCollator("sdpa")
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses


@pytest.mark.slow
def test_a_trainer_with_dataloader_workers_is_told_what_applies_to_it(
    packed_run: PackedRun, tmp_path: Path
) -> None:
    """``transformers.Trainer`` with ``dataloader_num_workers=2`` over a PackedDataset: each worker
    would get a whole copy of the dataset (every row served twice) and the position would stay in
    the workers, so it is refused, with advice a Trainer user can follow (it said to use
    PackedLoader, which a Trainer cannot take); with 0 workers the same Trainer trains."""
    pytest.importorskip("accelerate")
    ds = dataset(packed_run)
    model = tiny_llama("sdpa", ds.shards.manifest.header.tokenizer.vocab_size).train()

    def trainer(workers: int) -> transformers.Trainer:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"out{workers}"),
            max_steps=2,
            per_device_train_batch_size=2,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=workers,
            disable_tqdm=True,
            remove_unused_columns=False,
        )
        return transformers.Trainer(
            model=model, args=args, train_dataset=ds, data_collator=PackedCollator("sdpa")
        )

    with pytest.raises(RuntimeError) as refused:
        trainer(2).train()
    said = str(refused.value).strip().splitlines()[-1]
    assert "TrainingArguments(dataloader_num_workers=0)" in said and "transformers.Trainer" in said, said
    assert "every row" in said and "resume position" in said, said
    assert trainer(0).train().global_step == 2


def test_the_collator_takes_rows_loaded_with_datasets(packed_run: PackedRun) -> None:
    datasets = pytest.importorskip("datasets")
    folder = packed_run.folder(SEQ_LEN)
    first = sorted(folder.glob("*.arrow"))[0]
    rows = datasets.Dataset.from_file(str(first))
    ours = PackedCollator("sdpa")([rows[0], rows[1]])
    reference = to_transformers(collate_packed([dataset(packed_run)[0], dataset(packed_run)[1]]), "sdpa")
    for key in ("input_ids", "position_ids", "labels", "attention_mask"):
        assert torch.equal(ours[key], reference[key]), key


def test_the_header_survives_datasets(packed_run: PackedRun, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = packed_run.folder(SEQ_LEN)
    header = json.loads((folder / "manifest.json").read_text())["header"]
    files = sorted(str(p) for p in folder.glob("*.arrow"))
    loaded = {
        "from_file": datasets.Dataset.from_file(files[0]),
        "load_dataset": datasets.load_dataset(
            "arrow", data_files=files, split="train", cache_dir=str(tmp_path / "cache")
        ),
    }
    loaded["after_map"] = loaded["from_file"].map(
        lambda row: row, cache_file_name=str(tmp_path / "mapped.arrow")
    )
    for how, ds in loaded.items():
        got = read_header(ds)
        assert got.model_dump(exclude={"rows"}) == header, how
        assert got.seq_len == SEQ_LEN and got.tokenizer.sha256 == tokenizer_fingerprint(
            packed_run.tokenizer_path
        ), how
    assert len(loaded["load_dataset"]) == sum(
        s["rows"] for s in json.loads((folder / "manifest.json").read_text())["shards"]
    )
    with pytest.raises(ShardError, match="no longctx shard header"):
        read_header(datasets.Dataset.from_dict({"input_ids": [[1, 2]]}))


def test_features_are_what_datasets_would_declare(packed_run: PackedRun) -> None:
    datasets = pytest.importorskip("datasets")
    ours = hf_features(SEQ_LEN, "{}")
    del ours["input_ids"]["feature"]["id"]
    assert ours == datasets.Features.from_arrow_schema(shard_schema(SEQ_LEN)).to_dict()


def test_shards_of_format_version_1_are_refused(packed_run: PackedRun, tmp_path: Path) -> None:
    first = sorted(packed_run.folder(SEQ_LEN).glob("*.arrow"))[0]
    _, table = open_shard(first)
    meta = json.loads(table.schema.metadata[b"longctx"])
    meta["format_version"] = 1
    old = tmp_path / "old.arrow"
    table = table.replace_schema_metadata({b"longctx": json.dumps(meta).encode()})
    with pa.OSFile(str(old), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ShardError, match="written in format version 1; this version of longctx reads 2"):
        open_shard(old)


def test_a_dense_mask_above_the_limit_is_refused_before_it_is_allocated() -> None:
    """One 64K row would take a 16 GiB float32 mask: refused by default, naming the kernels to use."""
    from longctx.packer.hf import MAX_MASK_BYTES, MaskTooLarge

    seq_len = 1 << 16
    batch = {
        "input_ids": torch.zeros(1, seq_len, dtype=torch.int64),
        "position_ids": torch.arange(seq_len)[None],
        "labels": torch.zeros(1, seq_len, dtype=torch.int64),
        "cu_seqlens": torch.tensor([0, seq_len], dtype=torch.int32),
        "max_seqlen": seq_len,
    }
    with pytest.raises(MaskTooLarge) as refused:
        to_transformers(batch, "sdpa")
    message = str(refused.value)
    assert (
        "1 row of 65,536 tokens takes 16 GiB" in message
        and f"max_mask_bytes={MAX_MASK_BYTES >> 30} GiB" in message
    )
    assert "flash_attention_2" in message and "flex_attention" in message and "longctx train" in message
    assert "\n" not in message
    # flash attention needs no mask: the same batch is fine there
    assert to_transformers(batch, "flash_attention_2")["input_ids"].shape == (1, seq_len)


def test_the_mask_limit_is_exact_and_configurable(packed_run: PackedRun) -> None:
    from longctx.packer.hf import MaskTooLarge

    batch = collate_packed(busiest_rows(packed_run))  # 2 rows of 256 tokens: 2 x 256^2 x 4 bytes
    size = 2 * SEQ_LEN * SEQ_LEN * 4
    allowed = to_transformers(batch, "eager", max_mask_bytes=size)["attention_mask"]
    assert allowed.shape == (2, 1, SEQ_LEN, SEQ_LEN) and allowed.numel() * allowed.element_size() == size
    with pytest.raises(MaskTooLarge, match="2 rows of 256 tokens"):
        to_transformers(batch, "eager", max_mask_bytes=size - 1)
    with pytest.raises(MaskTooLarge):
        PackedCollator("sdpa", max_mask_bytes=size - 1)(busiest_rows(packed_run))
    bf16 = to_transformers(batch, "sdpa", mask_dtype=torch.bfloat16, max_mask_bytes=size // 2)[
        "attention_mask"
    ]
    assert torch.equal(bf16 == 0, allowed == 0)  # the same pattern in half the bytes
    assert to_transformers(batch, "sdpa", max_mask_bytes=None)["attention_mask"].shape == allowed.shape


def test_the_collator_takes_rows_with_a_labels_column_and_tensor_columns(packed_run: PackedRun) -> None:
    """Rows loaded with ``datasets`` as lists, with the ``labels`` list TRL adds, or as torch tensors
    (``with_format("torch")``) give the batch of the PackedDataset items."""
    datasets = pytest.importorskip("datasets")
    first = sorted(packed_run.folder(SEQ_LEN).glob("*.arrow"))[0]
    rows = datasets.Dataset.from_file(str(first))
    reference = to_transformers(collate_packed([dataset(packed_run)[0], dataset(packed_run)[1]]), "sdpa")
    with_labels = [dict(rows[i], labels=list(rows[i]["input_ids"])) for i in (0, 1)]
    tensors = rows.with_format("torch")
    for features in (with_labels, [tensors[0], tensors[1]]):
        ours = PackedCollator("sdpa")(features)
        for key in ("input_ids", "position_ids", "labels", "attention_mask"):
            assert torch.equal(ours[key], reference[key]), key


def test_a_row_cut_to_other_lengths_is_one_line_naming_the_columns(packed_run: PackedRun) -> None:
    datasets = pytest.importorskip("datasets")
    from longctx.packer.hf import PackedRowError

    first = sorted(packed_run.folder(SEQ_LEN).glob("*.arrow"))[0]
    row = datasets.Dataset.from_file(str(first))[0]
    cut = dict(row, input_ids=row["input_ids"][:100], labels=row["input_ids"][:100])  # what TRL did
    with pytest.raises(PackedRowError) as refused:
        PackedCollator("sdpa")([cut])
    message = str(refused.value)
    assert "input_ids 100, position_ids 256, loss_mask 256 tokens, cu_seqlens ends at 256" in message
    assert "skip_prepare_dataset" in message and "\n" not in message
    item = dataset(packed_run)[0]
    with pytest.raises(PackedRowError, match="input_ids 100, labels 256, position_ids 256, loss_mask 256"):
        PackedCollator("sdpa")([dict(item, input_ids=item["input_ids"][:100])])
    with pytest.raises(PackedRowError, match="lost cu_seqlens, loss_mask before the collator"):
        PackedCollator("sdpa")([{k: item[k] for k in ("input_ids", "labels", "position_ids")}])


@pytest.mark.slow
def test_trl_without_skip_prepare_dataset_is_one_line_naming_the_cut_columns(
    packed_run: PackedRun, tmp_path: Path
) -> None:
    """The mistake the README warns about, with TRL itself: its dataset preparation cuts input_ids to
    max_length and leaves the other columns whole; the collator names each column's length."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from longctx.packer.hf import PackedRowError

    # a copy: TRL's dataset preparation writes datasets' cache files beside the file it maps
    shard = tmp_path / "shard.arrow"
    shard.write_bytes(sorted(packed_run.folder(SEQ_LEN).glob("*.arrow"))[0].read_bytes())
    rows = datasets.Dataset.from_file(str(shard))
    tokenizer = transformers.AutoTokenizer.from_pretrained(packed_run.root)
    model = tiny_llama("sdpa", read_header(rows).tokenizer.vocab_size).train()
    args = trl.SFTConfig(
        str(tmp_path / "trl"),
        max_steps=1,
        max_length=64,
        per_device_train_batch_size=2,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        data_collator=PackedCollator("sdpa"),
    )
    with pytest.raises(PackedRowError) as refused:
        trainer.train()
    assert list(packed_run.folder(SEQ_LEN).glob("cache-*")) == []  # the shared shards left as they were
    assert "input_ids 64, position_ids 256, loss_mask 256 tokens, cu_seqlens ends at 256" in str(
        refused.value
    )
    assert "skip_prepare_dataset" in str(refused.value)


def test_read_header_counts_the_rows_of_the_dataset_it_is_given(
    packed_run: PackedRun, tmp_path: Path
) -> None:
    """The header stored in the features is one file's, rows included; a dataset of several files
    (or a selection) reports its own count, checked against the files' rows read with pyarrow."""
    datasets = pytest.importorskip("datasets")
    from longctx.packer.format import ShardHeader, ShardMetadata

    files = sorted(packed_run.folder(SEQ_LEN).glob("*.arrow"))
    per_file = [open_shard(f)[1].num_rows for f in files]
    assert len(files) > 1 and len(set(per_file)) > 1  # a wrong count cannot pass by chance
    every = datasets.load_dataset(
        "arrow", data_files=[str(f) for f in files], split="train", cache_dir=str(tmp_path / "cache")
    )
    assert read_header(every).rows == sum(per_file) == len(every)
    assert read_header(datasets.Dataset.from_file(str(files[1]))).rows == per_file[1]
    assert read_header(every.select(range(5))).rows == 5
    assert read_header(every.filter(lambda row: row["cu_seqlens"][1] < SEQ_LEN)).rows == sum(
        1 for f in files for cu in open_shard(f)[1].column("cu_seqlens").to_pylist() if cu[1] < SEQ_LEN
    )
    assert read_header(open_shard(files[1])[1].schema).rows == per_file[1]  # one file's schema: its rows
    bare = read_header(every.features)  # no dataset, no count
    assert type(bare) is ShardHeader and not isinstance(bare, ShardMetadata)
    assert bare == ShardHeader(**read_header(every).model_dump(exclude={"rows"}))

"""The pack job end to end on a synthetic curated corpus, checked against independent references:
tokens re-encoded from the source text, every document's tokens placed the configured number of
times, byte-identical reruns, mixing, the coverage refusal, and configuration errors."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from longctx import jobs
from longctx.cli import main
from longctx.config import RootConfig, load_config
from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.run_record import config_hash
from longctx.packer.catalog import read_catalog
from longctx.packer.format import ShardError
from longctx.packer.manifest import CoverageError
from longctx.packer.mix import plan_mix
from longctx.packer.reader import ShardSet
from longctx.packer.validate import validate_folder
from tests.packer.test_pack_helpers import ORIGINAL, SEQ_LENS, PackedRun, make_config, make_run

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture


def reference_tokens(tokenizer: Tokenizer, text: str, bos_id: int | None, eos_id: int) -> list[int]:
    """Encode one document on its own, the way a reader of the format would expect it."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ([bos_id] if bos_id is not None else []) + ids + [eos_id]


def segments_by_document(folder: Path) -> dict[str, list[tuple[int, list[int], int]]]:
    """Every document segment in the output: ``doc id -> [(offset, tokens, row)]``."""
    shards = ShardSet(folder)
    found: dict[str, list[tuple[int, list[int], int]]] = defaultdict(list)
    for r in range(len(shards)):
        row = shards.row(r)
        cu = row.cu_seqlens.tolist()
        for j, (a, b) in enumerate(itertools.pairwise(cu)):
            if row.doc_id[j] is not None:
                found[row.doc_id[j]].append((row.doc_offset[j], row.input_ids[a:b].tolist(), r))
    return found


@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_shards_hold_every_document_exactly_once_as_reencoded(packed_run: PackedRun, seq_len: int) -> None:
    tokenizer = packed_run.tokenizer
    eos = tokenizer.token_to_id("<|endoftext|>")
    found = segments_by_document(packed_run.folder(seq_len))
    assert set(found) == set(packed_run.texts)
    for doc_id, text in packed_run.texts.items():
        expected = reference_tokens(tokenizer, text, None, eos)
        placed = Counter()
        for offset, tokens, _ in found[doc_id]:
            assert tokens == expected[offset : offset + len(tokens)], f"{doc_id} at offset {offset}"
            placed.update(range(offset, offset + len(tokens)))
        assert placed == Counter(range(len(expected))), f"{doc_id}: tokens lost or duplicated"
        if len(expected) <= seq_len:
            assert len(found[doc_id]) == 1, f"short document {doc_id} was split"


@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_outputs_validate_and_the_manifest_adds_up(packed_run: PackedRun, seq_len: int) -> None:
    folder = packed_run.folder(seq_len)
    assert validate_folder(folder, packed_run.tokenizer_path) == []
    manifest = packed_run.manifests[seq_len]
    assert manifest.tokens == sum(
        len(reference_tokens(packed_run.tokenizer, t, None, 0)) for t in packed_run.texts.values()
    )
    assert manifest.tokens + manifest.padding == manifest.rows * seq_len
    assert sum(manifest.position_histogram) == manifest.tokens
    assert sum(s.documents for s in manifest.sources.values()) == len(packed_run.texts)
    assert manifest.max_position == seq_len - 1 and manifest.long_tokens > 0
    assert manifest.short_document_pieces == 0
    assert len(manifest.shards) > 2  # several shards per task
    assert {p.name for p in folder.glob("*.arrow")} == {s.file for s in manifest.shards}


def test_a_rerun_gives_byte_identical_output_and_a_resume_changes_nothing(
    packed_run: PackedRun, tmp_path: Path
) -> None:
    make_run(tmp_path)
    jobs.pack(make_config(tmp_path))
    for seq_len in SEQ_LENS:
        ours, theirs = tmp_path / "shards" / f"seq{seq_len}", packed_run.folder(seq_len)
        names = sorted(p.name for p in theirs.iterdir())
        assert names == sorted(p.name for p in ours.iterdir())
        for name in names:
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "shards").rglob("*")}
    jobs.pack(make_config(tmp_path))  # every task is recorded as complete: nothing is redone
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "shards").rglob("*")}


def test_mix_reaches_target_fractions_with_seeded_repeats(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    mix = {"books": 0.5, "papers": 0.3, "anchor": 0.2}
    cfg = make_config(tmp_path, mix=mix, seed=7, seq_lens=[512], strategy="bfd", mix_max_dropped=0.4)
    manifests = jobs.pack(cfg)
    manifest = manifests[512]
    for name, target in mix.items():
        assert manifest.sources[name].target_fraction == target
        assert abs(manifest.sources[name].fraction - target) < 0.03, (name, manifest.sources[name].fraction)
    # every document appears exactly as often as the plan says, a short one always whole
    plan = plan_mix(read_catalog(tmp_path / "documents"), mix, 7, 1)
    eos = tokenizer.token_to_id("<|endoftext|>")
    found = segments_by_document(tmp_path / "shards" / "seq512")
    for doc_id, text in texts.items():
        expected = reference_tokens(tokenizer, text, None, eos)
        copies = plan.copies(doc_id.split("/")[0], doc_id, len(expected) - 1)
        placed = Counter()
        for offset, tokens, _ in found.get(doc_id, []):
            placed.update(range(offset, offset + len(tokens)))
        assert placed == Counter(dict.fromkeys(range(len(expected)), copies) if copies else {}), doc_id
        if len(expected) <= 512:
            assert [(offset, len(tokens)) for offset, tokens, _ in found.get(doc_id, [])] == [
                (0, len(expected))
            ] * copies
    assert any(
        plan.copies("anchor", d, 0) > 1 for d in texts if d.startswith("anchor")
    )  # anchor is upsampled
    assert validate_folder(tmp_path / "shards" / "seq512") == []


def test_bos_and_concat_baseline(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    manifest = jobs.pack(make_config(tmp_path, strategy="concat", bos_token="<|bos|>", seq_lens=[256]))[256]
    bos, eos = tokenizer.token_to_id("<|bos|>"), tokenizer.token_to_id("<|endoftext|>")
    found = segments_by_document(tmp_path / "shards" / "seq256")
    for doc_id, text in texts.items():
        expected = reference_tokens(tokenizer, text, bos, eos)
        assert sorted(Counter(i for o, t, _ in found[doc_id] for i in range(o, o + len(t)))) == list(
            range(len(expected))
        )
        assert all(t == expected[o : o + len(t)] for o, t, _ in found[doc_id])
    assert manifest.header.strategy == "concat" and manifest.header.tokenizer.bos_id == bos
    assert manifest.short_document_pieces > 0  # the baseline cuts documents that would have fit
    assert manifest.padding < 256  # ...but pads only the last window of each task
    assert validate_folder(tmp_path / "shards" / "seq256") == []


def with_context(cfg: RootConfig, original: int, target: int) -> RootConfig:
    return cfg.model_copy(update={"context": ContextConfig(original=original, target=target)})


def test_no_token_reaching_original_context_is_refused(tmp_path: Path) -> None:
    make_run(tmp_path)
    cfg = make_config(tmp_path, seq_lens=[256])
    jobs.pack(with_context(cfg, 200, 1024))  # books and papers reach position 255 > 200: packed
    with pytest.raises(
        CoverageError, match=r"(?s)seq_len 256: no token reaches position 300.*books: 256 tokens"
    ):
        jobs.pack(with_context(cfg, 300, 300))


def test_refusal_is_explained_and_can_be_overridden(tmp_path: Path) -> None:
    make_run(tmp_path)
    cfg = make_config(tmp_path, seq_lens=[96], mix={"books": 0, "papers": 0, "anchor": 1})
    with pytest.raises(CoverageError) as err:
        jobs.pack(cfg)
    message = str(err.value)
    assert "anchor:" in message and "books" not in message and "pack.seq_lens entry above 128" in message
    assert "allow_short_positions" in message
    allowed = cfg.model_copy(update={"pack": cfg.pack.model_copy(update={"allow_short_positions": True})})
    assert jobs.pack(allowed)[96].long_tokens == 0


def test_refusal_without_token_counts_comes_from_the_packed_windows(tmp_path: Path) -> None:
    make_run(tmp_path, with_counts=False)
    cfg = make_config(tmp_path, seq_lens=[256])
    cfg = with_context(cfg, 400, 400)
    with pytest.raises(CoverageError, match="no token reaches position 400"):
        jobs.pack(cfg)
    assert not (tmp_path / "shards" / "seq256" / "manifest.json").exists()
    with pytest.raises(ShardError, match=r"no manifest\.json"):
        ShardSet(tmp_path / "shards" / "seq256")
    # allowing it resumes the same run: the packed tasks are not redone
    allowed = cfg.model_copy(update={"pack": cfg.pack.model_copy(update={"allow_short_positions": True})})
    assert jobs.pack(allowed)[256].rows > 0


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    make_run(tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text(
        f"output: {tmp_path}\ncontext: {{original: 128, target: 1024}}\npack: {{seq_len: [256]}}\n"
    )
    with pytest.raises(ConfigError, match=r"pack\.seq_len: unknown key \(did you mean 'seq_lens'\?\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"pack\.eos_token: '</s>' is not in the vocabulary"):
        jobs.pack(make_config(tmp_path, eos_token="</s>"))
    with pytest.raises(ConfigError, match=r"gives no fraction for curated source.*papers"):
        jobs.pack(make_config(tmp_path, mix={"books": 0.5, "anchor": 0.5}))
    with pytest.raises(ConfigError, match="mix fractions must sum to 1"):
        make_config(tmp_path, mix={"books": 0.5, "papers": 0.2, "anchor": 0.2})
    jobs.pack(make_config(tmp_path, seq_lens=[256]))
    with pytest.raises(ConfigError, match=r"made from other data \(different pack\.seed\)"):
        jobs.pack(make_config(tmp_path, seq_lens=[256], seed=1))


def test_missing_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer"):
        jobs.pack(make_config(tmp_path))
    make_run(tmp_path)
    (tmp_path / "documents" / "stray.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="not inside a source folder"):
        jobs.pack(make_config(tmp_path))


def test_manifest_is_plain_json_with_the_format_fields(packed_run: PackedRun) -> None:
    data = json.loads((packed_run.folder(256) / "manifest.json").read_text())
    header = data["header"]
    assert header["format"] == "longctx-packed-windows" and header["format_version"] == 2
    assert {"sha256", "vocab_size", "eos_id", "bos_id", "pad_id"} <= set(header["tokenizer"])
    assert (header["seq_len"], header["original_context"], header["target_context"]) == (256, ORIGINAL, 1024)
    assert data["config"]["pack"]["seq_len"] == 256 and "seq_lens" not in data["config"]["pack"]
    assert header["config_sha256"] == config_hash(data["config"])
    assert all({"file", "rows", "bytes", "xxh3_128"} == set(s) for s in data["shards"])
    assert 0 < data["long_fraction"] < 1 and data["efficiency"] > 0.9
    assert (
        np.array(data["sources"]["books"]["position_histogram"]).sum() == data["sources"]["books"]["tokens"]
    )


def test_cli_prints_summary_and_mix_reached(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    make_run(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output: {tmp_path}\ncontext: {{original: 128, target: 256}}\n"
        "pack: {mix: {books: 0.6, papers: 0.2, anchor: 0.2}, mix_max_dropped: 0.3, executor: {tasks: 1}}\n"
    )
    assert main(["pack", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "mix (pack.mix, seed 0): " in out and "mix reached:" in out
    assert "books            target 0.600, share 0." in out
    assert (
        f"{tmp_path / 'shards' / 'seq256'}\n" in out and "efficiency" in out
    )  # seq_lens default to context.target
    assert main(["pack", "--config", str(config), "--output", str(tmp_path / "elsewhere")]) == 2
    assert "no tokenizer at" in capsys.readouterr().err

"""The mix says what it does with every source, and refuses to drop much of one silently.

The reference for "what the mix did" is the shards themselves: every document segment carries its
document id and offset, so the copies of each document, the documents never packed, and the tokens
used per source are counted from the rows, and each document's length from re-encoding its text.
The report printed by ``pack`` and recorded in every manifest must match those counts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from longctx import jobs
from longctx.cli import main
from longctx.packer.manifest import Manifest
from longctx.packer.mix import MixError
from tests.packer.test_pack_helpers import make_config, make_run
from tests.packer.test_pack_pipeline import reference_tokens, segments_by_document

MIX = {"books": 0.3, "papers": 0.5, "anchor": 0.2}  # books hold 73% of the tokens: most must go


def counted_from_shards(folder: Path, texts: dict[str, str], tokenizer) -> dict[str, dict[str, float]]:
    """Per source, from the rows and the re-encoded texts: documents, documents used and dropped,
    tokens available, used (with repeats) and dropped, epochs and the most copies of a document."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    length = {doc: len(reference_tokens(tokenizer, text, None, eos)) for doc, text in texts.items()}
    placed: Counter[str] = Counter()
    for doc, segments in segments_by_document(folder).items():
        placed[doc] += sum(len(tokens) for _, tokens, _ in segments)
    out: dict[str, dict[str, float]] = {}
    for source in {doc.split("/")[0] for doc in texts}:
        docs = [doc for doc in texts if doc.startswith(source + "/")]
        copies = {doc: placed[doc] // length[doc] for doc in docs}
        assert all(placed[doc] == copies[doc] * length[doc] for doc in docs)  # whole copies only
        tokens = sum(length[doc] for doc in docs)
        used = sum(placed[doc] for doc in docs)
        out[source] = {
            "documents": len(docs),
            "documents_used": sum(1 for doc in docs if copies[doc]),
            "documents_dropped": sum(1 for doc in docs if not copies[doc]),
            "tokens": tokens,
            "tokens_used": used,
            "tokens_dropped": sum(length[doc] for doc in docs if not copies[doc]),
            "epochs": used / tokens,
            "max_copies": max(copies.values()),
        }
    return out


def assert_report_matches_shards(manifest: Manifest, folder: Path, texts: dict[str, str], tokenizer) -> None:
    expected = counted_from_shards(folder, texts, tokenizer)
    assert manifest.mix is not None
    assert set(manifest.mix.sources) == set(expected)
    for source, counts in expected.items():
        got = manifest.mix.sources[source]
        for key, value in counts.items():
            assert getattr(got, key) == pytest.approx(value), (source, key)
    assert manifest.mix.tokens_used == sum(c["tokens_used"] for c in expected.values()) == manifest.tokens


def test_a_mix_that_drops_much_of_a_source_is_refused_naming_it(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    with pytest.raises(MixError) as refused:
        jobs.pack(make_config(tmp_path, mix=MIX, seq_lens=[512]))
    message = str(refused.value)
    # the independent count: what the allowed run below actually leaves out of books
    assert "pack.mix would drop " in message and "documents of source 'books'" in message
    assert "more than pack.mix_max_dropped allows (10%)" in message
    assert "set pack.mix_total_tokens: " in message and "set pack.mix_max_dropped: " in message
    assert "'papers'" not in message.split("\n")[0]  # papers are repeated, not dropped
    assert not (tmp_path / "shards").exists() and not (tmp_path / "work").exists()  # nothing changed

    allowed = float(message.rsplit("set pack.mix_max_dropped: ", 1)[1].rstrip("."))
    manifest = jobs.pack(make_config(tmp_path, mix=MIX, seq_lens=[512], mix_max_dropped=allowed))[512]
    counts = counted_from_shards(tmp_path / "shards" / "seq512", texts, tokenizer)["books"]
    assert (
        f"drop {counts['documents_dropped']} of {counts['documents']} documents of source 'books'" in message
    )
    assert f"{counts['tokens_dropped'] / counts['tokens']:.0%})" in message
    assert counts["tokens_dropped"] / counts["tokens"] <= allowed
    assert_report_matches_shards(manifest, tmp_path / "shards" / "seq512", texts, tokenizer)


def test_the_suggested_total_keeps_every_document(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    with pytest.raises(MixError) as refused:
        jobs.pack(make_config(tmp_path, mix=MIX, seq_lens=[512]))
    total = int(str(refused.value).split("set pack.mix_total_tokens: ", 1)[1].split()[0])
    manifest = jobs.pack(make_config(tmp_path, mix=MIX, seq_lens=[512], mix_total_tokens=total))[512]
    counts = counted_from_shards(tmp_path / "shards" / "seq512", texts, tokenizer)
    assert all(c["documents_dropped"] == 0 for c in counts.values())
    assert counts["papers"]["epochs"] > 5  # the price: papers are repeated
    assert_report_matches_shards(manifest, tmp_path / "shards" / "seq512", texts, tokenizer)
    for source, target in MIX.items():
        assert manifest.sources[source].fraction == pytest.approx(target, abs=0.02)


def test_a_source_given_fraction_zero_is_dropped_without_refusal(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    mix = {"books": 0.0, "papers": 0.6, "anchor": 0.4}
    cfg = make_config(tmp_path, mix=mix, seq_lens=[1024], mix_max_dropped=0.0, mix_total_tokens=30_000)
    manifest = jobs.pack(cfg)[1024]
    assert_report_matches_shards(manifest, tmp_path / "shards" / "seq1024", texts, tokenizer)
    assert manifest.mix.sources["books"].documents_dropped == 5 and manifest.mix.sources["books"].epochs == 0


def test_without_a_mix_every_document_is_reported_used_once(tmp_path: Path) -> None:
    tokenizer, texts = make_run(tmp_path)
    manifest = jobs.pack(make_config(tmp_path, seq_lens=[256]))[256]
    assert_report_matches_shards(manifest, tmp_path / "shards" / "seq256", texts, tokenizer)
    assert manifest.mix.seed is None
    assert {s.epochs for s in manifest.mix.sources.values()} == {1.0}


def test_the_report_is_printed_before_packing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output: {tmp_path}\ncontext: {{original: 128, target: 512}}\n"
        "pack: {mix: {books: 0.6, papers: 0.2, anchor: 0.2}, mix_max_dropped: 0.3, executor: {tasks: 1}}\n"
    )
    assert main(["pack", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    report = out.split("[pack 1/2]")[0]  # printed before the first stage starts
    manifest = jobs.pack(load(config))[512]
    assert report.startswith("mix (pack.mix, seed 0): ")
    for source, use in manifest.mix.sources.items():
        row = next(line for line in report.splitlines() if line.split()[:1] == [source])
        cells = row.replace("|", " ").split()
        assert cells[1:3] == [f"{use.target_fraction:.3f}", f"{use.fraction:.3f}"]
        assert cells[3:6] == [f"{n:,}" for n in (use.documents, use.documents_used, use.documents_dropped)]
        assert cells[-2:] == [f"{use.epochs:.2f}", str(use.max_copies)]


def load(config: Path):
    from longctx.config import load_config

    return load_config(config)

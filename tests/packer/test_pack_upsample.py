"""``pack.upsample_long``: long documents repeated within their source, the source's share unchanged.

The reference is the shards and the texts, never the plan: each document's length is its text
re-encoded on its own (with its EOS), its copies are the tokens the rows place from it divided by
that length, and from these the test works out, by its own arithmetic, each source's tokens, the
tokens of its long and short documents, and the rate the recipe (Fu et al. 2024: keep each source's
share, use its long documents ``factor`` times as often as its short ones) asks of each. The mix
report printed by ``pack`` and recorded in the manifest must show the same numbers.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx import jobs
from longctx.cli import main
from longctx.core.errors import ConfigError
from longctx.packer.manifest import load_manifest
from longctx.pipeline.bpe import train_bpe
from tests.packer.test_pack_helpers import ORIGINAL, TARGET, WORDS, make_config, make_run, write_curated
from tests.packer.test_pack_pipeline import reference_tokens, segments_by_document

MIN_TOKENS = 2000
FACTOR = 3.0
MIX = {"web": 0.7, "code": 0.3}
EDGES = [MIN_TOKENS, 4096, 32768, 131072]  # the report's buckets: its fixed edges and min_tokens


def corpus(seed: int = 0) -> dict[str, list[str]]:
    """Two sources that each hold short documents (tens to hundreds of words) and a few long ones
    (over a thousand words, about 2.5 tokens a word with the small tokenizer)."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) for _ in range(words // 8 + 1)
        )

    return {
        "web": [text(rng.randint(40, 300)) for _ in range(24)]
        + [text(rng.randint(1100, 1500)) for _ in range(3)],
        "code": [text(rng.randint(100, 500)) for _ in range(12)]
        + [text(rng.randint(1200, 1700)) for _ in range(3)],
    }


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A curated run folder of :func:`corpus`, copied by each test that packs it."""
    root = tmp_path_factory.mktemp("curated")
    texts = corpus()
    tokenizer = train_bpe([t for docs in texts.values() for t in docs], 320, root / "tokenizer.json")
    write_curated(root, texts, tokenizer)
    return root


def copy_run(curated: Path, root: Path) -> Path:
    shutil.copytree(curated, root)
    return root


def document_lengths(root: Path) -> dict[str, int]:
    """Every document's packed length: its text encoded on its own, plus its EOS."""
    from longctx.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(root / "tokenizer.json")
    eos = tokenizer.token_to_id("<|endoftext|>")
    texts = corpus()
    return {
        f"{source}/doc{i:03d}.txt": len(reference_tokens(tokenizer, text, None, eos))
        for source, docs in texts.items()
        for i, text in enumerate(docs)
    }


def copies_in_shards(folder: Path, lengths: dict[str, int]) -> dict[str, int]:
    """How many times the rows hold every document (whole copies only)."""
    placed = {
        doc: sum(len(tokens) for _, tokens, _ in segments)
        for doc, segments in segments_by_document(folder).items()
    }
    copies = {doc: placed.get(doc, 0) // length for doc, length in lengths.items()}
    assert all(placed.get(doc, 0) == copies[doc] * lengths[doc] for doc in lengths)
    return copies


def long_document(length: int) -> bool:
    """Whether a document of ``length`` packed tokens is long: its text (the length less its EOS)
    has at least ``MIN_TOKENS`` tokens."""
    return length - 1 >= MIN_TOKENS


def bucket(length: int) -> int:
    return sum(length - 1 >= edge for edge in EDGES)


def write_config(root: Path, **pack: Any) -> Path:
    settings = {
        "seq_lens": [1024],
        "shard_tokens": 8192,
        "pool_tokens": 16384,
        "executor": {"tasks": 2, "workers": 1},
    }
    path = root.parent / f"{root.name}.yaml"
    config = {
        "output": str(root),
        "context": {"original": ORIGINAL, "target": TARGET},
        "pack": settings | pack,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()
    }


def test_each_source_keeps_its_share_and_its_long_documents_are_used_factor_times_as_often(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_run(curated, tmp_path / "run")
    total = 300_000
    upsample = {"min_tokens": MIN_TOKENS, "factor": FACTOR}
    config = write_config(root, mix=MIX, mix_total_tokens=total, upsample_long=upsample)
    assert main(["pack", "--config", str(config)]) == 0
    printed = capsys.readouterr().out.splitlines()
    manifest = load_manifest(root / "shards" / "seq1024")
    assert printed[0].startswith(
        f"mix (pack.mix, seed 0; documents of {MIN_TOKENS:,}+ tokens x{FACTOR:g} within their source): "
    )
    header = next(i for i, line in enumerate(printed) if line.split()[1:2] == ["<2000"])
    assert printed[header].split() == ["source", "<2000", "2000-4K", "4K-32K", "32K-128K", ">=128K"]
    by_length = {line.split()[0]: line.split()[1:] for line in printed[header + 1 : header + 1 + len(MIX)]}
    lengths = document_lengths(root)
    copies = copies_in_shards(root / "shards" / "seq1024", lengths)
    used_total = sum(copies[d] * lengths[d] for d in lengths)
    assert used_total == manifest.tokens == manifest.mix.tokens_used
    for source, fraction in MIX.items():
        docs = [d for d in lengths if d.startswith(source + "/")]
        long, short = (
            [d for d in docs if long_document(lengths[d])],
            [d for d in docs if not long_document(lengths[d])],
        )
        assert long and short, "the corpus must give every source both kinds"
        t_long, t_short = sum(lengths[d] for d in long), sum(lengths[d] for d in short)
        used_long = sum(copies[d] * lengths[d] for d in long)
        used_short = sum(copies[d] * lengths[d] for d in short)
        longest, longest_short = max(lengths[d] for d in long), max(lengths[d] for d in short)
        # the source's share: as configured, within half of its longest short document
        wanted = fraction * total
        assert abs(used_long + used_short - wanted) <= longest_short / 2, source
        assert manifest.sources[source].target_fraction == fraction
        assert manifest.sources[source].fraction == pytest.approx((used_long + used_short) / used_total)
        # within it, a long document's rate is FACTOR times a short one's
        rate = wanted / (FACTOR * t_long + t_short)
        assert abs(used_long - FACTOR * rate * t_long) <= longest / 2, source
        odds = (used_long / t_long) / (used_short / t_short)
        slack_long, slack_short = longest / (2 * t_long), (longest + longest_short) / (2 * t_short)
        low, high = (
            (FACTOR * rate - slack_long) / (rate + slack_short),
            (FACTOR * rate + slack_long) / (rate - slack_short),
        )
        assert low <= odds <= high and FACTOR - 0.5 < odds < FACTOR + 0.5, (source, odds)
        # the report: tokens by length bucket, available and used, as counted here
        use = manifest.mix.sources[source]
        available = [sum(lengths[d] for d in docs if bucket(lengths[d]) == k) for k in range(len(EDGES) + 1)]
        used = [
            sum(copies[d] * lengths[d] for d in docs if bucket(lengths[d]) == k)
            for k in range(len(EDGES) + 1)
        ]
        assert use.tokens_by_length == available and use.tokens_used_by_length == used
        cells = [
            f"{a / sum(available):.3f} -> {u / sum(used):.3f}" for a, u in zip(available, used, strict=True)
        ]
        assert by_length[source] == " ".join(cells).split()
    assert manifest.mix.length_edges == EDGES
    assert manifest.mix.upsample_long.model_dump() == upsample


def test_the_documented_reports_are_what_pack_prints(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/packing.md shows the report of this corpus without and with upsampling: both are what
    ``pack`` prints."""
    page = (Path(__file__).parents[2] / "docs" / "packing.md").read_text(encoding="utf-8")
    marker = (
        "<!-- tested-by: tests/packer/test_pack_upsample.py::"
        "test_the_documented_reports_are_what_pack_prints -->"
    )
    documented = [part.split("```text\n", 1)[1].split("\n```", 1)[0] for part in page.split(marker)[1:]]
    settings = {"mix": {"web": 0.7, "code": 0.3}, "mix_total_tokens": 300_000}
    upsampled = {"upsample_long": {"min_tokens": 2000, "factor": 3}}
    assert len(documented) == 2
    for block, extra in zip(documented, [{}, upsampled], strict=True):
        root = copy_run(curated, tmp_path / f"run{len(extra)}")
        assert main(["pack", "--config", str(write_config(root, **settings, **extra))]) == 0
        assert capsys.readouterr().out.split("[pack 1/2]")[0].rstrip("\n") == block


def test_without_a_mix_every_source_keeps_its_own_share(curated: Path, tmp_path: Path) -> None:
    """Fu et al.'s domain-preserving form: no pack.mix, so each source keeps its share of the curated
    tokens (and the total), while its long documents are used three times as often as its short ones."""
    root = copy_run(curated, tmp_path / "run")
    config = make_config(
        root, seq_lens=[1024], mix_max_dropped=1.0, upsample_long={"min_tokens": MIN_TOKENS, "factor": FACTOR}
    )
    manifest = jobs.pack(config)[1024]
    lengths = document_lengths(root)
    copies = copies_in_shards(root / "shards" / "seq1024", lengths)
    curated_total = sum(lengths.values())
    for source in MIX:
        docs = [d for d in lengths if d.startswith(source + "/")]
        own = sum(lengths[d] for d in docs)
        used = sum(copies[d] * lengths[d] for d in docs)
        longest_short = max(lengths[d] for d in docs if not long_document(lengths[d]))
        assert abs(used - own) <= longest_short / 2, source  # its own tokens' worth, from other documents
        assert manifest.sources[source].target_fraction == pytest.approx(own / curated_total)
        assert any(copies[d] > 1 for d in docs if long_document(lengths[d]))
        assert any(copies[d] == 0 for d in docs if not long_document(lengths[d]))
    assert manifest.mix.own_shares and manifest.mix.seed == 0


@pytest.mark.parametrize("mix", [MIX, None], ids=["with-mix", "without-mix"])
def test_a_factor_of_1_changes_nothing(curated: Path, tmp_path: Path, mix: dict[str, float] | None) -> None:
    """Every file of the shards folders (manifests included) is the same byte for byte as without the
    setting."""
    plain, one = copy_run(curated, tmp_path / "plain"), copy_run(curated, tmp_path / "one")
    settings: dict[str, Any] = {"seq_lens": [1024], "mix_max_dropped": 1.0} | ({"mix": mix} if mix else {})
    jobs.pack(make_config(plain, **settings))
    jobs.pack(make_config(one, **settings, upsample_long={"min_tokens": MIN_TOKENS, "factor": 1}))
    assert shard_bytes(plain) == shard_bytes(one) and shard_bytes(one)


def test_a_run_packed_without_the_setting_is_kept_with_a_factor_of_1(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run packed before the setting existed resumes as it is under a factor of 1 (nothing packed
    again), and is refused, naming the setting, under another factor."""
    root = copy_run(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[1024]))
    before = {p: p.stat().st_mtime_ns for p in (root / "shards").rglob("*")}
    capsys.readouterr()
    jobs.pack(make_config(root, seq_lens=[1024], upsample_long={"min_tokens": MIN_TOKENS, "factor": 1}))
    assert "already packed, kept as it is" in capsys.readouterr().out
    assert before == {p: p.stat().st_mtime_ns for p in (root / "shards").rglob("*")}
    with pytest.raises(ConfigError, match=r"made from other data \(different pack\.upsample_long\)"):
        jobs.pack(
            make_config(
                root, seq_lens=[1024], mix_max_dropped=1.0, upsample_long={"min_tokens": 100, "factor": 2}
            )
        )


def test_an_interrupted_upsampling_run_resumes_to_the_same_bytes(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run left as a kill leaves it (task 0 complete; task 1 not: its completion, its summary, the
    manifest stage and the manifest missing, its last shard cut short) resumes: only task 1 runs
    again, and the shards are the bytes of a run that was never interrupted (each document's copies
    are decided again, the same way)."""
    pack = {
        "mix": MIX,
        "mix_total_tokens": 150_000,
        "upsample_long": {"min_tokens": MIN_TOKENS, "factor": FACTOR},
    }
    clean = copy_run(curated, tmp_path / "clean")
    assert main(["pack", "--config", str(write_config(clean, **pack))]) == 0
    root = copy_run(curated, tmp_path / "run")
    config = write_config(root, **pack)
    assert main(["pack", "--config", str(config)]) == 0
    folder, work = root / "shards" / "seq1024", root / "work" / "pack"
    (folder / "manifest.json").unlink()
    (work / "seq1024" / "logs" / "1_pack" / "completions" / "00001").unlink()
    shutil.rmtree(work / "seq1024" / "logs" / "2_manifest")
    (work / "tasks" / "seq1024" / "00001.json").unlink()
    last = sorted(folder.glob("00001_*.arrow"))[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    capsys.readouterr()
    assert main(["pack", "--config", str(config)]) == 0
    assert "2 tasks, 1 done in an earlier run" in capsys.readouterr().out
    assert shard_bytes(root) == shard_bytes(clean)


def test_the_suggested_total_keeps_every_document(curated: Path, tmp_path: Path) -> None:
    """Upsampling drops short documents unless the total grows: the refusal names a
    pack.mix_total_tokens at which, counted in the shards, no document is left out."""
    root = copy_run(curated, tmp_path / "run")
    upsample = {"min_tokens": MIN_TOKENS, "factor": FACTOR}
    with pytest.raises(ConfigError) as refused:
        jobs.pack(make_config(root, seq_lens=[1024], mix=MIX, upsample_long=upsample))
    message = str(refused.value)
    assert message.startswith("pack.mix would drop ") and "more than pack.mix_max_dropped allows" in message
    total = int(message.split("set pack.mix_total_tokens: ", 1)[1].split()[0])
    jobs.pack(make_config(root, seq_lens=[1024], mix=MIX, upsample_long=upsample, mix_total_tokens=total))
    lengths = document_lengths(root)
    assert min(copies_in_shards(root / "shards" / "seq1024", lengths).values()) >= 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            {"min_tokens": 2000, "factor": 0.5},
            "pack.upsample_long.factor: Input should be greater than or equal to 1",
        ),
        (
            {"min_tokens": 2000, "factor": 0},
            "pack.upsample_long.factor: Input should be greater than or equal to 1",
        ),
        (
            {"min_tokens": 2000, "factor": float("inf")},
            "pack.upsample_long.factor: Input should be a finite number",
        ),
        ({"min_tokens": 2000, "factor": "many"}, "pack.upsample_long.factor: Input should be a valid number"),
        ({"min_tokens": 0, "factor": 2}, "pack.upsample_long.min_tokens: Input should be greater than 0"),
        ({"min_tokens": 1.5, "factor": 2}, "pack.upsample_long.min_tokens: Input should be a valid integer"),
        ({"factor": 2}, "pack.upsample_long.min_tokens: required, and missing"),
        ({"min_tokens": 2000, "factor": 2, "domains": 1}, "pack.upsample_long.domains: unknown key"),
        (3, "pack.upsample_long: Input should be a valid dictionary"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_key(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any, expected: str
) -> None:
    root = copy_run(curated, tmp_path / "run")
    config = write_config(root, upsample_long=value)
    assert main(["pack", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "upsample_long" in line]
    assert line.strip().startswith(expected) and "Traceback" not in err
    assert not (root / "shards").exists()


def test_documents_without_token_counts_are_refused_naming_the_key(tmp_path: Path) -> None:
    make_run(tmp_path, with_counts=False)
    with pytest.raises(ConfigError) as refused:
        jobs.pack(make_config(tmp_path, upsample_long={"min_tokens": 100, "factor": 2}))
    assert str(refused.value) == (
        "pack.upsample_long needs token counts, but documents of anchor, books, papers have no token_count; "
        "curate them with `longctx curate` or leave pack.upsample_long out"
    )


def test_a_manifest_written_before_the_length_buckets_still_reads(curated: Path, tmp_path: Path) -> None:
    """Readers take the manifests of runs packed before this report had length buckets: without
    their keys the fields are empty."""
    import json

    from longctx.packer.manifest import parse_manifest

    root = copy_run(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[1024], mix=MIX, mix_max_dropped=1.0))
    data = json.loads((root / "shards" / "seq1024" / "manifest.json").read_text())
    for key in ("own_shares", "upsample_long", "length_edges"):
        del data["mix"][key]
    for use in data["mix"]["sources"].values():
        del use["tokens_by_length"], use["tokens_used_by_length"]
    old = parse_manifest(json.dumps(data).encode(), "old manifest.json")
    assert old.mix.length_edges == [] and old.mix.upsample_long is None and not old.mix.own_shares
    assert all(use.tokens_by_length == [] for use in old.mix.sources.values())

"""``longctx inspect``: summarize, validate, show and plot packed shards."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for real inside the functions, keeping `longctx --help` fast
    from longctx.packer.format import ShardFile, ShardHeader
    from longctx.packer.reader import PackedRow, ShardColumns


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="summarize, validate, decode or plot packed shards",
        description=(
            "Summarize packed shards: rows, tokens, padding, tokens per source, and histograms of position "
            "ids and segment lengths, all recomputed from the rows. PATH is an output folder "
            "(<output>/shards/seq<N>, with its manifest.json), the shards folder above several of them, or a "
            "single .arrow shard; locally or as an fsspec URL (s3://bucket/run/shards/seq<N>), which is "
            "first copied into a local cache, every shard checked against its manifest. Credentials and "
            "endpoint come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)."
        ),
    )
    parser.add_argument(
        "path", metavar="PATH", help="output folder, shards folder, or one .arrow file; a path or a URL"
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="check every invariant (lengths, boundaries, positions, loss mask, provenance, tokenizer "
        "fingerprint, checksums, manifest totals); exit 1 naming the file, row and field of the first "
        "violations",
    )
    parser.add_argument(
        "--show",
        type=int,
        metavar="ROW",
        help="decode row ROW with its segments and provenance marked (instead of the summary)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="write the histograms as a figure (a local file)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json for --show and the fingerprint check (default: <output>/tokenizer.json)",
    )
    parser.add_argument(
        "--max-chars", type=int, default=2000, help="characters shown per segment with --show"
    )
    parser.add_argument("--max-errors", type=int, default=20, help="violations reported by --validate")
    parser.add_argument(
        "--cache",
        help="where a PATH given as a URL is copied and checked (default $LONGCTX_CACHE or ~/.cache/longctx)",
    )
    parser.set_defaults(func=run)


def _targets(path: Path) -> list[Path]:
    """The output folders (or single file) that PATH names."""
    from longctx.core.layout import shard_folders
    from longctx.packer.manifest import MANIFEST_NAME

    if path.is_file() or (path / MANIFEST_NAME).is_file():
        return [path]
    found = [folder for folder in shard_folders(path) if (folder / MANIFEST_NAME).is_file()]
    return found or [path]


def _remote_targets(url: str, cache: Path | None) -> list[tuple[str, Path]]:
    """``(URL, checked local copy)`` of the remote output folders (or single shard) that PATH names:
    a folder with a manifest, else the ``seq<N>`` folders under it; none found is a one-line error."""
    from longctx.core.remote import RemoteError
    from longctx.packer.format import ShardError
    from longctx.packer.remote import fetch_shard, fetch_shards, is_shard_file, shard_folder_urls

    if is_shard_file(url):
        return [(url, fetch_shard(url, cache))]
    try:
        return [(url, fetch_shards(url, cache))]
    except ShardError:  # no manifest here: a shards folder above seq<N> folders, or nothing
        try:
            folders = shard_folder_urls(url)
        except RemoteError:
            folders = []
        if not folders:
            raise
    return [(folder, fetch_shards(folder, cache)) for folder in folders]


def _default_tokenizer(target: Path) -> Path | None:
    """The tokenizer of the run whose ``shards/seq<N>`` folder holds ``target``, when it has one."""
    from longctx.core.layout import RunLayout

    folder = target.parent if target.is_file() else target
    return RunLayout.of_shard_folder(folder).tokenizer_file()


@dataclass
class _Opened:
    """What inspect reads from a target: the shared header, manifest config and shard entries, the
    shards themselves (opened lazily), and random access to rows."""

    header: ShardHeader
    config: dict[str, Any]
    entries: list[ShardFile]
    shards: Iterator[ShardColumns]
    row: Callable[[int], PackedRow]
    rows: int


def _open(target: Path) -> _Opened:
    from longctx.packer.format import ShardFile, ShardHeader, file_checksum, open_shard
    from longctx.packer.reader import ShardColumns, ShardSet

    if target.is_file():
        meta, table = open_shard(target)
        columns = ShardColumns(meta, table)
        entry = ShardFile(
            file=target.name, rows=meta.rows, bytes=target.stat().st_size, xxh3_128=file_checksum(target)
        )
        header = ShardHeader(**meta.model_dump(exclude={"rows"}))
        return _Opened(header, {}, [entry], iter([columns]), columns.row, meta.rows)
    shard_set = ShardSet(target)
    manifest = shard_set.manifest
    shards = (shard_set.shard(i) for i in range(len(manifest.shards)))
    return _Opened(manifest.header, manifest.config, manifest.shards, shards, shard_set.row, len(shard_set))


def _validate(target: Path, label: str, tokenizer: Path | None, max_errors: int) -> bool:
    from longctx.core.text import plural
    from longctx.packer.validate import validate_file, validate_folder

    violations = (
        validate_file(target, max_errors)
        if target.is_file()
        else validate_folder(target, tokenizer, max_errors)
    )
    for violation in violations:
        print(f"INVALID {violation}")
    if violations:
        print(f"{label}: {plural(len(violations), 'violation')} shown (at most --max-errors={max_errors})")
        return False
    print(f"{label}: valid (every invariant holds)")
    return True


def _show(opened: _Opened, label: str, row: int, tokenizer_path: Path | None, max_chars: int) -> None:
    from longctx.core.tokenizer import load_tokenizer, tokenizer_fingerprint
    from longctx.packer.report import format_row

    if not 0 <= row < opened.rows:
        raise IndexError(f"--show {row}: out of range, the rows are 0..{opened.rows - 1}")
    tokenizer = None
    if tokenizer_path is not None:
        if tokenizer_fingerprint(tokenizer_path) == opened.header.tokenizer.sha256:
            tokenizer = load_tokenizer(tokenizer_path)
        else:
            print(f"{tokenizer_path} is not the shards' tokenizer; showing token ids", file=sys.stderr)
    print(format_row(opened.row(row), row, tokenizer, max_chars, where=label))


def _inspect(target: Path, label: str, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from longctx.packer.manifest import build_manifest
    from longctx.packer.report import format_manifest, plot_manifest, stats_from_shards

    tokenizer_path = args.tokenizer or _default_tokenizer(target)
    if args.validate and not _validate(target, label, tokenizer_path, args.max_errors):
        return 1
    opened = _open(target)
    if args.show is None or args.plot:  # --show alone prints the row only, without reading every shard
        shards = tqdm(
            opened.shards, total=len(opened.entries), desc="reading shards", unit="shard", file=sys.stderr
        )
        stats = stats_from_shards(shards, opened.header.seq_len, opened.header.original_context)
        summary = build_manifest(opened.header, opened.config, opened.entries, stats, None)
        if args.show is None:
            print(format_manifest(summary, title=label))
        if args.plot:
            plot_manifest(summary, args.plot)
            print(f"histograms written to {args.plot}")
    if args.show is not None:
        _show(opened, label, args.show, tokenizer_path, args.max_chars)
    return 0


def run(args: argparse.Namespace) -> int:
    from longctx.commands import check_counts, local_path
    from longctx.core.remote import is_remote
    from longctx.packer.format import ShardError

    check_counts({"--max-errors": args.max_errors, "--max-chars": args.max_chars})
    args.plot = local_path(args.plot, "--plot", "write the figure to a local file")
    args.cache = local_path(args.cache, "--cache", "the cache is a local folder")
    status = 0
    if is_remote(args.path):
        targets = _remote_targets(args.path, args.cache)
    else:
        targets = [(str(t), t) for t in _targets(Path(args.path))]
    plot = args.plot
    for label, target in targets:
        if plot is not None and len(targets) > 1:  # one figure per output folder
            args.plot = plot.with_name(f"{plot.stem}_{target.name}{plot.suffix}")
        try:
            status = max(status, _inspect(target, label, args))
        except (ShardError, IndexError) as err:
            print(f"longctx inspect: {err}", file=sys.stderr)
            status = max(status, 2)
    return status

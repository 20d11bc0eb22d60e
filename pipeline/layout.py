"""The output folder of a run, shared by every job (curate, pack, train, eval)::

    <output>/
      corpus/                  the embedded default corpus, when no input is given
      tokenizer.json           the run's tokenizer (copied or trained by curate)
      documents/<source>/      curated documents (Parquet)
      ledger.parquet, stats.json, stats.png
      shards/seq<N>/           packed windows and their manifest.json
      train/                   checkpoints, metrics.jsonl, the final model
      eval/                    evaluation results
      work/<job>/              a job's intermediate files and datatrove logs (resume state)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run folder, seen from one job (``job`` names its ``work/`` subfolder)."""

    root: Path
    job: str

    @property
    def work(self) -> Path:
        return self.root / "work" / self.job

    @property
    def default_corpus(self) -> Path:
        return self.root / "corpus"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer.json"

    @property
    def documents(self) -> Path:
        return self.root / "documents"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.parquet"

    @property
    def stats(self) -> Path:
        return self.root / "stats.json"

    @property
    def plot(self) -> Path:
        return self.root / "stats.png"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    def output(self, seq_len: int) -> Path:
        """The shard folder of windows of ``seq_len`` tokens."""
        return self.shards / f"seq{seq_len}"

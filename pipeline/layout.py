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

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    @property
    def run_record(self) -> Path:
        """What determined this job's output (``work/<job>/run.json``), written when it first ran."""
        return self.work / "run.json"

    def changed_since_recorded(self, fingerprint: dict[str, Any]) -> list[str] | None:
        """Keys of ``fingerprint`` that differ from the recorded run; None when nothing is recorded.
        A job refuses to resume into an output that a different configuration started."""
        if not self.run_record.exists():
            return None
        previous = json.loads(self.run_record.read_text(encoding="utf-8"))
        return sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))

    def record_run(self, fingerprint: dict[str, Any]) -> None:
        """Write the run record atomically."""
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.run_record.with_name(self.run_record.name + ".tmp")
        tmp.write_text(json.dumps(fingerprint, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.run_record)

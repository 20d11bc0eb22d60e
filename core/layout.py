"""The output folder of a run, shared by every job (curate, pack, train, eval)::

    <output>/
      corpus/                  the embedded default corpus, when no input is given
      tokenizer.json           the run's tokenizer (copied or trained by curate)
      tokenizer_config.json    its special tokens, when it declares them (read by pack)
      chat_template.jinja      its chat template, when it has one in this file (kept for the export)
      documents/<source>/      curated documents (Parquet)
      ledger.parquet, stats.json, stats.png
      curation.json            the curated files and their checksums, when curation publishes them
      shards/seq<N>/           packed windows of N tokens and their manifest.json
      train/                   checkpoints/, metrics.jsonl, final/ (the trained model), export/step_<N>/,
                               compile_cache/ (torch's compiler caches, TORCHINDUCTOR_CACHE_DIR),
                               and tensorboard/ and wandb/ when those trackers are on
      train/stages/<k>-<N>/    a staged run's stage k (windows of N tokens): its own checkpoints/,
                               metrics.jsonl, final/, export/step_<N>/ and gate.json; the trackers'
                               folders stay in train/ (one run across stages)
      train/stages/<k>-<N>.superseded-<m>/
                               a stage set aside, as it was, when the stage before it changed and it
                               was trained again
      eval/<NNN>/              one folder per evaluation, numbered in order
      cache/<scheme>/<path>/   checked copies of remote shard folders (train.shards given as a URL)
                               and of published curations (pack.input given as a URL)
      work/<job>/              a job's intermediate files, run record and datatrove logs (resume state)

Every path of an output folder is built here, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SHARD_FOLDER_PREFIX = "seq"


def shard_folder(shards: Path, seq_len: int) -> Path:
    """The folder of windows of ``seq_len`` tokens under a shards folder: ``<shards>/seq<N>``."""
    return shards / f"{SHARD_FOLDER_PREFIX}{seq_len}"


def shard_folders(shards: Path) -> list[Path]:
    """The ``seq<N>`` folders under a shards folder, by ascending ``N``."""
    found = [
        p for p in shards.glob(f"{SHARD_FOLDER_PREFIX}*") if p.name[len(SHARD_FOLDER_PREFIX) :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(SHARD_FOLDER_PREFIX) :]))


@dataclass(frozen=True)
class StageLayout:
    """The folder of one stage of a staged training run (``train/stages/<k>-<seq_len>/``): the same
    files an unstaged run keeps in ``train/`` (checkpoints, metrics, the exported model), plus the
    stage's gate result."""

    folder: Path
    number: int
    seq_len: int

    @property
    def checkpoints(self) -> Path:
        return self.folder / "checkpoints"

    @property
    def metrics(self) -> Path:
        """One JSON line per logged step of this stage."""
        return self.folder / "metrics.jsonl"

    @property
    def final_model(self) -> Path:
        """The stage's trained model, as a Hugging Face checkpoint folder."""
        return self.folder / "final"

    def export(self, step: int) -> Path:
        """A checkpoint of this stage exported as a Hugging Face folder."""
        return self.folder / "export" / f"step_{step:07d}"

    @property
    def gate(self) -> Path:
        """The stage's gate result (``longctx.trainer.evaluation.gates``), written once it is evaluated."""
        return self.folder / "gate.json"

    def superseded(self, number: int) -> Path:
        """Where the stage's folder is set aside (``<k>-<N>.superseded-<number>``, from 1) when the
        stage is trained again from a changed predecessor."""
        return self.folder.with_name(f"{self.folder.name}.superseded-{number}")


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run folder, seen from one job (``job`` names its ``work/`` subfolder)."""

    root: Path
    job: str = ""

    @property
    def work(self) -> Path:
        """This job's intermediate files, run record and logs."""
        if not self.job:
            raise ValueError("RunLayout.work needs the job's name")
        return self.root / "work" / self.job

    @property
    def run_record(self) -> Path:
        """What determined this job's output (``work/<job>/run.json``), written when it first ran."""
        return self.work / "run.json"

    @property
    def console_log(self) -> Path:
        """Where the job's datatrove task logs go when they are not shown on the console."""
        return self.work / "logs" / "console.log"

    @property
    def default_corpus(self) -> Path:
        return self.root / "corpus"

    @classmethod
    def of_shard_folder(cls, folder: Path) -> RunLayout:
        """The run a ``<output>/shards/seq<N>`` folder belongs to (when it is one)."""
        return cls(folder.parent.parent)

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer.json"

    def tokenizer_file(self, configured: Path | None = None) -> Path | None:
        """The tokenizer the run's shards were packed with: the run's ``tokenizer.json`` (curation copies
        or trains it there), else ``configured`` (the config's ``tokenizer.path`` as a local file)."""
        return self.tokenizer if self.tokenizer.is_file() else configured

    @property
    def tokenizer_config(self) -> Path:
        """The ``tokenizer_config.json`` beside the run's tokenizer (its special tokens)."""
        return self.root / "tokenizer_config.json"

    @property
    def chat_template(self) -> Path:
        """The tokenizer's chat template, when it keeps it in a file of its own (transformers >= 4.47)."""
        return self.root / "chat_template.jinja"

    @property
    def tokenizer_files(self) -> tuple[Path, Path, Path]:
        """Every file of the run's tokenizer: ``tokenizer.json``, then the side files that may be absent."""
        return (self.tokenizer, self.tokenizer_config, self.chat_template)

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
    def curation_manifest(self) -> Path:
        """The list of a finished curation's files with their checksums, uploaded last when curation
        publishes them (``longctx.pipeline.publish``)."""
        return self.root / "curation.json"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    def shard_folder(self, seq_len: int) -> Path:
        """The shard folder of windows of ``seq_len`` tokens."""
        return shard_folder(self.shards, seq_len)

    def training_shards(self, configured: str | None, target: int) -> str | Path:
        """The shards training reads: ``configured`` (``train.shards``: a folder or an fsspec URL), else
        the packer's windows of the ``target`` context (``shards/seq<target>``)."""
        return configured or self.shard_folder(target)

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def checkpoints(self) -> Path:
        return self.train / "checkpoints"

    @property
    def metrics(self) -> Path:
        """One JSON line per logged training step."""
        return self.train / "metrics.jsonl"

    @property
    def stages(self) -> Path:
        """The stages of a staged run (``train.stages``), one folder each."""
        return self.train / "stages"

    def stage(self, number: int, seq_len: int) -> StageLayout:
        """Stage ``number`` (from 1) of a staged run, training windows of ``seq_len`` tokens."""
        return StageLayout(self.stages / f"{number}-{seq_len}", number, seq_len)

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files of the training run (``train.log.tensorboard``)."""
        return self.train / "tensorboard"

    @property
    def wandb(self) -> Path:
        """Weights & Biases run folders (``train.log.wandb``), and the id a resumed run continues."""
        return self.train / "wandb"

    @property
    def wandb_run_id(self) -> Path:
        """The W&B run id of this training run, kept so that a resumed run logs to the same run."""
        return self.wandb / "run_id"

    @property
    def compile_cache(self) -> Path:
        """torch's compiler caches (``TORCHINDUCTOR_CACHE_DIR``) for the training processes: what
        ``train.kernels.compile`` compiles, reused when the run resumes, and the folder importing
        ``torch._dynamo`` (optimizers and FSDP2 do) creates, kept here rather than in ``$TMPDIR``,
        where it would outlive the run."""
        return self.train / "compile_cache"

    @property
    def final_model(self) -> Path:
        """The trained model, as a Hugging Face checkpoint folder."""
        return self.train / "final"

    def export(self, step: int) -> Path:
        """A checkpoint exported as a Hugging Face folder (``longctx train --export STEP``)."""
        return self.train / "export" / f"step_{step:07d}"

    @property
    def cache(self) -> Path:
        """Local copies of remote shard folders and published curations
        (``longctx.core.remote.cache_folder`` under it)."""
        return self.root / "cache"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

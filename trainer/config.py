"""The ``train`` section of a run's YAML config."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from longctx.core.config import MUST_EXIST, StorageOptions, StrictModel, WorldCheck, missing_extra
from longctx.core.errors import ConfigError
from longctx.core.remote import is_remote
from longctx.pipeline.synthetic.kinds import TaskKind
from longctx.trainer.models.files import CONFIG_NAME, is_model_folder
from longctx.trainer.models.rope_keys import check_rope_scaling, takes_factor
from longctx.trainer.parallel.mesh import MeshShape


class TinyModelConfig(StrictModel):
    """A small random Llama-family model, for the demo and tests (no download needed). The keys mean
    what they mean in a ``transformers`` ``LlamaConfig``: each head gets ``hidden_size /
    num_attention_heads`` dimensions, which must be a whole, even number (RoPE rotates pairs), and
    ``num_key_value_heads`` must divide ``num_attention_heads``."""

    hidden_size: int = Field(default=64, gt=0)
    intermediate_size: int = Field(default=172, gt=0)
    num_hidden_layers: int = Field(default=2, gt=0)
    num_attention_heads: int = Field(default=4, gt=0)
    num_key_value_heads: int = Field(default=2, gt=0)
    tie_word_embeddings: bool = True

    @field_validator("num_attention_heads")
    @classmethod
    def _even_head_size(cls, value: int, info: ValidationInfo) -> int:
        """Each head gets ``hidden_size / num_attention_heads`` dimensions, and RoPE rotates them in
        pairs: the head size must be a whole, even number."""
        hidden = info.data.get("hidden_size")
        if hidden is None:
            return value
        if hidden % value:
            raise ValueError(
                f"hidden_size ({hidden}) must be a multiple of num_attention_heads ({value}): each head gets "
                "hidden_size / num_attention_heads dimensions"
            )
        if (hidden // value) % 2:
            raise ValueError(
                f"hidden_size / num_attention_heads = {hidden} / {value} = {hidden // value} is an odd head "
                "size, and RoPE rotates pairs of dimensions: choose them so that the head size is even"
            )
        return value

    @field_validator("num_key_value_heads")
    @classmethod
    def _whole_query_groups(cls, value: int, info: ValidationInfo) -> int:
        """Grouped-query attention: every key/value head serves the same number of query heads."""
        heads = info.data.get("num_attention_heads")
        if heads is not None and heads % value:
            raise ValueError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({value}): each "
                "key/value head serves a whole group of query heads"
            )
        return value


class ModelSection(StrictModel):
    """The model to continue pretraining: a Hugging Face checkpoint folder (``config.json`` plus
    safetensors) or, when ``hf_path`` is null, a tiny random Llama.

    ``implementation`` says which code runs it: ``longctx``, this package's own Llama-family decoder
    (Llama, Mistral and Qwen2 layouts); ``transformers``, the checkpoint's own transformers modeling
    code with longctx's ring attention plugged into its attention interface (any RoPE decoder the
    installed transformers has, e.g. Qwen3, OLMo 2, Phi-3, Granite; the ``transformers`` extra);
    ``auto``, the own decoder where it reads the checkpoint, transformers otherwise.
    ``rope_scaling`` replaces the checkpoint's RoPE scaling, written the way Hugging Face configs
    declare it, e.g. ``{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 8192}``.
    """

    hf_path: Annotated[Path | None, MUST_EXIST] = Field(
        default=None, description="a Hugging Face checkpoint folder; null: the tiny random model"
    )
    implementation: Literal["auto", "longctx", "transformers"] = Field(
        default="auto",
        description="longctx: the own Llama/Mistral/Qwen2 decoder; transformers: the model's transformers "
        "code with ring attention (the transformers extra); auto: longctx where it reads the checkpoint",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    rope_theta: float | None = Field(default=None, gt=0, description="RoPE base; default: the checkpoint's")
    rope_scaling: dict[str, Any] | None = Field(
        default=None,
        description="rope_type linear, dynamic, ntk, yarn, llama3 or longrope with its keys; null: the "
        "checkpoint's",
    )

    @field_validator("rope_scaling")
    @classmethod
    def _known_rope_scaling(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_rope_scaling(value)
        return value


class OptimConfig(StrictModel):
    """AdamW with linear warmup then cosine decay; continued-pretraining defaults.

    Every number must be finite (``.inf`` and ``.nan`` are refused at load, not met as a NaN loss
    a step later); the betas lie in [0, 1), as AdamW's moment averages need."""

    model_config = ConfigDict(allow_inf_nan=False)

    lr: float = Field(default=2e-5, gt=0, description="peak learning rate")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="final lr as a fraction of lr")
    warmup_steps: int = Field(default=10, ge=0, description="steps of linear warmup to lr")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW's betas, each in [0, 1)")
    eps: float = Field(default=1e-8, gt=0, description="AdamW's epsilon")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW's decoupled weight decay")
    grad_clip: float = Field(default=1.0, gt=0, description="largest gradient norm (clipped above it)")

    @field_validator("betas")
    @classmethod
    def _betas_below_one(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError("AdamW's betas must each lie in [0, 1)")
        return value


class CoverageConfig(StrictModel):
    """Refuse runs that would never train the extended positions.

    Before the first step the shards' largest position must reach ``required_position``, as given
    (default: ``context.target - 1``, the windows' last position; in a staged run, capped at each
    stage's last position). While training, the run aborts when ``max_steps_without_long`` steps pass
    without any trained token at or beyond ``context.original`` (not checked in windows of
    ``context.original`` tokens or fewer, which cannot hold one). ``allow_short`` turns both checks
    into warnings.
    """

    required_position: int | None = Field(
        default=None, gt=0, description="position the shards must reach; default context.target - 1"
    )
    max_steps_without_long: int = Field(
        default=50, gt=0, description="steps without a token at or beyond context.original before aborting"
    )
    allow_short: bool = Field(default=False, description="warn instead of refusing")


class CheckpointConfig(StrictModel):
    """Distributed checkpoints under ``<output>/train/checkpoints/step_<N>/``
    (``longctx.trainer.checkpoint``)."""

    every: int = Field(default=100, gt=0, description="steps between checkpoints (and one at the end)")
    keep: int = Field(default=2, gt=0, description="most recent intact checkpoints kept")


class ExportConfig(StrictModel):
    """The Hugging Face folder written at the end of training (``<output>/train/final``) and by
    ``longctx train --export STEP``.

    ``dtype: auto`` stores the weights in the dtype of the base checkpoint's tensors (bf16 for
    Llama-3) and in float32 for the tiny random model. ``output`` (an fsspec URL such as
    ``s3://bucket/run``, or a folder) also publishes each folder there once written, as
    ``<output>/final`` and ``<output>/export/step_<N>``, with ``config.json`` last (credentials:
    ``train.storage_options``).
    """

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="dtype of the exported weights; auto: the base checkpoint's"
    )
    max_shard_size: str = Field(default="5GB", description="largest safetensors file, e.g. 5GB or 500MB")
    output: str | None = Field(
        default=None, description="also publish the exported folders here (an fsspec URL or a folder)"
    )


class WandbConfig(StrictModel):
    """A Weights & Biases run (``wandb.init``'s arguments). ``offline`` writes the run under
    ``<output>/train/wandb`` without any network access (``wandb sync`` uploads it later);
    ``disabled`` turns W&B off without removing the section."""

    project: str = Field(min_length=1, description="the W&B project")
    entity: str | None = Field(default=None, description="the W&B team or user; default: yours")
    name: str | None = Field(default=None, description="run name; default: the output folder's name")
    group: str | None = Field(default=None, description="groups related runs in the W&B interface")
    tags: list[str] = Field(default_factory=list, description="labels of the run")
    mode: Literal["online", "offline", "disabled"] = Field(
        default="online", description="online: send as it runs; offline: write locally; disabled: off"
    )


def _tensorboard_missing(on: bool) -> str | None:
    return missing_extra("tensorboard", "tensorboard") if on else None


def _wandb_missing(wandb: WandbConfig | None) -> str | None:
    return missing_extra("wandb", "wandb") if wandb is not None and wandb.mode != "disabled" else None


class LogConfig(StrictModel):
    """Where training metrics go, and how often.

    Every ``every`` steps (and at the last step) one record is written to
    ``<output>/train/metrics.jsonl``, always, and to TensorBoard (``<output>/train/tensorboard``) and
    Weights & Biases when configured; only rank 0 writes. Loss by position is computed on these
    steps only (it costs one more pass of the LM head). Both trackers are optional extras:
    ``pip install 'longctx[tensorboard]'`` / ``'longctx[wandb]'``.
    """

    every: int = Field(default=10, gt=0, description="steps between metric records")
    tensorboard: Annotated[bool, WorldCheck(_tensorboard_missing)] = Field(
        default=False, description="also write TensorBoard events (the tensorboard extra)"
    )
    wandb: Annotated[WandbConfig | None, WorldCheck(_wandb_missing)] = Field(
        default=None, description="also send to Weights & Biases (the wandb extra)"
    )


class KernelsConfig(StrictModel):
    """Which implementations compute the model (``longctx.trainer.models.kernels``). Each choice that is
    not installed or fails its start-up probe on the device falls back, with one line saying why.
    Optional packages: ``pip install 'longctx[gpu]'`` (liger-kernel, flash-attn-4)."""

    attention: Literal[
        "auto",
        "flash_attn4_varlen",
        "flash_attn_varlen",
        "torch_flash_varlen",
        "torch_cudnn",
        "torch_efficient",
        "math",
        "cpu_flash",
    ] = Field(
        default="auto",
        description="the ring's block kernel. auto: on a GPU the first usable of FlashAttention-4, "
        "FlashAttention-2 and PyTorch's flash varlen kernels, then PyTorch's memory-efficient kernel; on the "
        "CPU PyTorch's flash kernel for CPU. Or one kernel pinned (torch_cudnn: cuDNN through SDPA)",
    )
    fused: Literal["auto", "liger", "none"] = Field(
        default="auto",
        description="RMSNorm, SwiGLU, RoPE and the loss (fused linear cross-entropy, no full logits) from "
        "liger-kernel: liger, none (PyTorch's ops) or auto (liger where installed, on a GPU); the own "
        "decoder only (train.model.implementation transformers uses PyTorch's ops)",
    )
    compile: bool = Field(
        default=False,
        description="torch.compile each decoder block around its attention (not with selective "
        "activation checkpointing; the own decoder only); caches under <output>/train/compile_cache",
    )


class GateConfig(StrictModel):
    """What a stage must reach before the next one starts (``longctx.trainer.evaluation.gates``), measured
    on the
    stage's exported model right after its last step, with the ``eval`` section's settings (needle
    kinds, depths and samples; short-context source and windows; the baseline model). Each key left
    null is not checked; a gate with none set passes."""

    min_needle_score: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="the needle-grid score at the stage's length (the mean item score over "
        "eval.needle.kinds, a point estimate; its count and interval are in the gate's detail) must reach "
        "this",
    )
    max_short_loss_ratio: float | None = Field(
        default=None,
        gt=0,
        description="the short-context loss (eval.short_context's held-out windows) over the reference "
        "model's (short_loss_reference) must stay at or below this",
    )
    short_loss_reference: Literal["released", "baseline"] = Field(
        default="released",
        description="the model max_short_loss_ratio divides by: released, the base model as released (its "
        "own RoPE, without train.model.rope_scaling and rope_theta); baseline, the eval.baseline model (the "
        "base with the run's RoPE)",
    )
    require_effective_length: bool = Field(
        default=False,
        description="the effective context length (eval.effective's definition, over eval.needle.lengths up "
        "to the stage's length and the stage's length) must reach the stage's length",
    )

    @property
    def checks(self) -> list[str]:
        """The names of the metrics this gate checks."""
        names = []
        if self.min_needle_score is not None:
            names.append("needle_score")
        if self.max_short_loss_ratio is not None:
            names.append("short_loss_ratio")
        if self.require_effective_length:
            names.append("effective_length")
        return names


def missing_local_shards(shards: str | None) -> str | None:
    """A local shard folder must exist; a URL is checked when it is read."""
    if shards is None or is_remote(shards) or Path(shards).exists():
        return None
    return f"path does not exist: {shards}"


class StageConfig(StrictModel):
    """One stage of ``train.stages``: ``steps`` optimizer steps on the windows of ``seq_len`` tokens
    (``<output>/shards/seq<seq_len>``, or ``shards``), starting from the previous stage's final
    weights. RoPE: ``rope_scaling`` replaces ``train.model.rope_scaling`` for this stage, or ``factor``
    keeps its type and keys and changes only the factor; neither keeps it as it is."""

    seq_len: int = Field(gt=0, description="window length; the shards of this length are trained on")
    steps: int = Field(gt=0, description="optimizer steps of this stage")
    rope_scaling: dict[str, Any] | None = Field(
        default=None, description="this stage's RoPE scaling, written as train.model.rope_scaling"
    )
    factor: float | None = Field(
        default=None, ge=1, description="train.model.rope_scaling with this factor (the same rope_type)"
    )
    lr: float | None = Field(default=None, gt=0, description="peak learning rate; default train.optim.lr")
    global_batch_rows: int | None = Field(
        default=None, gt=0, description="rows per optimizer step; default train.global_batch_rows"
    )
    keep_optimizer: bool = Field(
        default=False,
        description="start from the previous stage's AdamW moments too (the schedule restarts either way); "
        "false: a fresh optimizer",
    )
    shards: Annotated[str | None, WorldCheck(missing_local_shards)] = Field(
        default=None, description="a shard folder or fsspec URL; default <output>/shards/seq<seq_len>"
    )
    gate: GateConfig | None = Field(default=None, description="checked after the stage; null: no gate")

    @field_validator("rope_scaling")
    @classmethod
    def _known_rope_scaling(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_rope_scaling(value)
        return value

    @model_validator(mode="after")
    def _one_rope_setting(self) -> StageConfig:
        if self.rope_scaling is not None and self.factor is not None:
            raise ValueError("give rope_scaling or factor, not both")
        return self


class TrainConfig(StrictModel):
    """``longctx train``: continue pretraining on packed shards with ring attention."""

    shards: Annotated[str | None, WorldCheck(missing_local_shards)] = Field(
        default=None,
        description="a shard folder or an fsspec URL of one (s3://bucket/run/shards/seq65536); "
        "default <output>/shards/seq<target>",
    )
    cache: Path | None = Field(
        default=None,
        description="where shards given by URL are copied and checked before "
        "training; default <output>/cache",
    )
    storage_options: StorageOptions = Field(
        description="fsspec options (credentials, endpoint_url...) for a train.shards or "
        "train.export.output URL",
    )
    model: ModelSection = Field(default_factory=ModelSection)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    coverage: CoverageConfig = Field(default_factory=CoverageConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    steps: int = Field(default=20, gt=0, description="optimizer steps in all (a resumed run continues to it)")
    global_batch_rows: int | None = Field(
        default=None,
        gt=0,
        description="packed rows per optimizer step over all data-parallel ranks; a multiple of the "
        "data-parallel size (each rank accumulates global_batch_rows / dp rows). Fixes the data order "
        "independently of the world size. Default: one row per data-parallel rank",
    )
    holdout_rows: int = Field(
        default=0,
        ge=0,
        description="windows set aside (drawn at random by seed) and never trained on; longctx eval scores "
        "them first",
    )
    cp: int = Field(default=1, gt=0, description="context-parallel group size; must divide the world size")
    cp_mode: Literal["auto", "ring", "ulysses", "allgather", "hybrid"] = Field(
        default="auto",
        description="how the cp ranks attend over a window split among them (docs/training.md, "
        "Context-parallel modes). ring: key/value blocks pass around the ranks, overlapped with compute; "
        "allgather: every rank gathers all keys and values; ulysses: all-to-alls trade tokens for heads "
        "(the heads must split over cp); hybrid: ulysses within groups of train.ulysses ranks, a ring across "
        "them; auto: longctx plan's recommendation for the model, window and cp",
    )
    ulysses: int | None = Field(
        default=None,
        gt=1,
        description="ranks of one all-to-all group with cp_mode hybrid (a divisor of cp, best the GPUs of "
        "one node); the ring spans cp / ulysses groups",
    )
    cp_layout: Literal["balanced", "zigzag"] = Field(
        default="balanced",
        description="which tokens of a packed row each cp rank holds. balanced: the same number of tokens "
        "and of causal attention work per rank, whatever the documents' lengths, and short documents kept "
        "whole on one rank; zigzag: chunks r and 2cp-1-r (balanced for rows of one document)",
    )
    dp_replicate: int = Field(
        default=1,
        gt=0,
        description="replicas of the sharded model state (HSDP, e.g. one per node); the state is sharded "
        "over the other world_size / dp_replicate ranks",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="auto: bf16 compute (fp32 master weights and reductions) on GPU, fp32 on CPU",
    )
    activation_checkpointing: Literal["auto", "none", "selective", "full"] = Field(
        default="auto",
        description="what each block keeps for backward. none: everything; selective: the outputs of its "
        "matmuls and attention (norms, RoPE and SwiGLU's pointwise work are recomputed); full: its input "
        "(the whole block is recomputed); auto: the first of none, selective, full whose memory estimate "
        "(longctx plan's) fits the device (true/false are accepted for full/none)",
    )
    kernels: KernelsConfig = Field(default_factory=KernelsConfig)
    seed: int = Field(default=0, description="data order, held-out rows and the tiny model's initialization")
    comm_timeout_s: int = Field(
        default=600, gt=0, description="process-group timeout: a dead rank is an error, not a hang"
    )
    log: LogConfig = Field(default_factory=LogConfig)
    stages: list[StageConfig] | None = Field(
        default=None,
        min_length=1,
        description="train in stages of growing window length, each from the previous one's weights and "
        "checked by its gate (longctx.trainer.stages); replaces steps and shards",
    )
    on_gate_fail: Literal["stop", "continue"] = Field(
        default="stop",
        description="stop: a failed gate ends the run (exit 2, the finished stages kept); continue: log it "
        "and go on",
    )

    @model_validator(mode="after")
    def _cp_mode_fits_cp(self) -> TrainConfig:
        if self.cp_mode == "auto":
            if self.ulysses is not None:
                raise ValueError("train.ulysses is the all-to-all degree of train.cp_mode hybrid; set both")
            return self
        MeshShape.check_mode(
            self.cp_mode, self.cp, self.ulysses, mode_key="train.cp_mode", ulysses_key="train.ulysses"
        )
        return self

    @model_validator(mode="after")
    def _stages_replace_steps_and_shards(self) -> TrainConfig:
        if self.stages is None:
            return self
        for key in ("steps", "shards"):
            if key in self.model_fields_set:
                raise ValueError(
                    f"train.{key} (or --{key}) and train.stages: each stage has its own {key} "
                    f"(train.stages[k].{key}); remove train.{key}"
                )
        lengths = [stage.seq_len for stage in self.stages]
        if any(b <= a for a, b in itertools.pairwise(lengths)):
            raise ValueError(f"train.stages: each stage's seq_len must exceed the one before: {lengths}")
        scaling = self.model.rope_scaling
        for k, stage in enumerate(self.stages):
            if stage.factor is not None and (scaling is None or not takes_factor(scaling)):
                raise ValueError(
                    f"train.stages[{k}].factor changes the factor of train.model.rope_scaling, which "
                    f"{'is not set' if scaling is None else 'has no factor'}: declare its rope_type there "
                    "(e.g. {rope_type: yarn, factor: 2.0, original_max_position_embeddings: 8192}), or give "
                    "the stage a whole rope_scaling"
                )
        return self

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _boolean_switch(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "full" if value else "none"
        return value

    @field_validator("shards", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    grad_accum: Any = Field(
        default=None, exclude=True, repr=False, deprecated="replaced by global_batch_rows"
    )

    @field_validator("grad_accum")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(
                "replaced by train.global_batch_rows: packed rows per optimizer step over all data-parallel "
                "ranks (= grad_accum x the data-parallel size)"
            )
        return value


class NeedleEvalConfig(StrictModel):
    """The needle-retrieval grid: context lengths x depths, per task kind."""

    lengths: list[int] = Field(
        default_factory=lambda: [256, 512, 1024, 2048], min_length=1, description="prompt lengths in tokens"
    )
    depths: list[float] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0],
        min_length=1,
        description="where the needle sits, as a fraction of the prompt (0: start, 1: end)",
    )
    kinds: list[TaskKind] = Field(
        default_factory=lambda: ["single_needle"],
        min_length=1,
        description="task kinds (longctx.pipeline.synthetic.kinds); the recall-scored ones (multi_query, "
        "document_qa, common_words, frequent_words) score the fraction of a list retrieved; json_kv, "
        "icl_labels and nolima_needle (HELMET, NoLiMa) score the whole value",
    )
    seed: int = Field(default=0, description="the same seed and documents give the same needles")
    samples: int | None = Field(
        default=None,
        gt=0,
        description="items per (task kind, length), spread evenly over the depths, each from its own seed; "
        "null: enough for a 95% interval of at most +/-0.1 on each length's score (93 items per length, "
        "shared among the kinds)",
    )
    max_new_tokens: int = Field(
        default=16,
        gt=0,
        description="tokens generated per answer; the recall-scored and whole-value kinds get at least "
        "their answer's tokens plus 8",
    )

    @field_validator("lengths")
    @classmethod
    def _lengths_positive(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError(f"lengths must be at least 1 token, got {value}")
        return value

    @field_validator("depths")
    @classmethod
    def _depths_in_unit_interval(cls, value: list[float]) -> list[float]:
        if any(not 0.0 <= d <= 1.0 for d in value):
            raise ValueError(f"depths must lie in [0, 1], got {value}")
        return value


class EffectiveLengthConfig(StrictModel):
    """Effective context length (``longctx.trainer.evaluation.effective``, after RULER and NoLiMa): the
    largest needle-grid length L such that every evaluated length up to L clears the threshold with
    the lower end of its score's 95% Wilson interval; the first failing length is reported beside it.

    The threshold is ``threshold`` when set (absolute, as RULER's), else ``fraction`` of the model's
    own score at its shortest evaluated length (NoLiMa). A model whose score there is below
    ``min_short_score`` gets no length: its result is undetermined, with that reason.
    """

    threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="an absolute threshold (RULER: a reference model's score at a short length); null: "
        "fraction of the model's own score at its shortest evaluated length",
    )
    fraction: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description="the threshold as a fraction of the model's own score at its shortest evaluated length "
        "(NoLiMa: 0.85); unused when threshold is set",
    )
    min_short_score: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="below this score at the shortest evaluated length, the effective length is undetermined",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_baseline_length(cls, data: Any) -> Any:
        if isinstance(data, dict) and "baseline_length" in data:
            raise ValueError(
                "baseline_length was removed: each model's threshold comes from its own score at the "
                "shortest length of eval.needle.lengths (drop the key; list that length there)"
            )
        return data


class ShortContextConfig(StrictModel):
    """The short-context guard (``longctx.trainer.evaluation.short_context``): each model's mean next-token
    loss
    on ``windows`` windows of ``length`` tokens (default ``context.original``) cut from the curated
    documents of ``source``, and its ratio to the ``eval.baseline`` model's. Windows start at
    multiples of ``length`` in their document (a shorter document is one window) and are drawn by
    ``seed``. Documents that any training row of the run holds (read from the shards' ``doc_id``) are
    left out, so the windows are held out; a source with none left is reported and the guard skipped."""

    source: str = Field(default="anchor", min_length=1, description="a curated source (documents/<source>)")
    length: int | None = Field(default=None, gt=1, description="tokens per window; default context.original")
    windows: int = Field(default=16, gt=0)
    seed: int = 0


MODEL_KEYWORDS = ("base", "trained")


def check_base_model(models: list[str], train: TrainConfig | None) -> None:
    """Refuse ``base`` in ``eval.models`` without a ``train`` section: ``base`` is its model."""
    if "base" in models and train is None:
        raise ConfigError("eval.models: 'base' is the model of the train section, and this config has none")


def _missing_model(models: list[str]) -> str | None:
    """A model that is not a keyword must be a Hugging Face checkpoint folder."""
    for model in models:
        if model not in MODEL_KEYWORDS and not is_model_folder(model):
            return (
                f"{model!r} is neither {' nor '.join(MODEL_KEYWORDS)} nor a Hugging Face checkpoint folder "
                f"(a folder with {CONFIG_NAME})"
            )
    return None


class EvalConfig(StrictModel):
    """``longctx eval``: loss by position on packed windows and the needle grid, for each model of
    ``models`` on the same windows and needles.

    A model is ``base`` (the model training starts from: ``train.model``, with the run's RoPE
    settings, random-initialized from ``train.seed`` when it is the tiny model), ``trained``
    (``<output>/train/final``) or a Hugging Face checkpoint folder (``./base`` for a folder named
    like a keyword). Each evaluation writes a new folder ``<output>/eval/<NNN>``.

    ``baseline`` names the model the short-context guard measures the others against (the
    short-window loss ratio); the effective length holds each model to its own short score.
    """

    models: Annotated[list[str], WorldCheck(_missing_model)] = Field(
        default_factory=lambda: list(MODEL_KEYWORDS),
        min_length=1,
        description="base, trained or Hugging Face checkpoint folders (--model overrides)",
    )
    shards: Annotated[str | None, WorldCheck(missing_local_shards)] = Field(
        default=None,
        description="windows to score: a shard folder or an fsspec URL of one "
        "(s3://bucket/run/shards/seq65536), copied into train.cache (default <output>/cache) and checked "
        "first; default the training shards",
    )
    documents: Annotated[str | None, WorldCheck(missing_local_shards)] = Field(
        default=None,
        description="curated documents to hide the needles in and cut the short-context guard's windows "
        "from: a documents folder (<run>/documents, one folder per source) or an fsspec URL of one, copied "
        "into train.cache (default <output>/cache); default the run's own (or pack.input's)",
    )
    storage_options: StorageOptions = Field(
        description="fsspec options (credentials, endpoint_url...) for an eval.shards or eval.documents URL; "
        "default train.storage_options",
    )
    rows: int = Field(
        default=8,
        gt=0,
        description="windows scored for loss by position: the held-out ones (train.holdout_rows) first",
    )
    seed: int = Field(default=0, description="which windows are scored when none are held out")
    allow_training_windows: bool = Field(
        default=False,
        description="score windows training read when the training shards hold fewer than eval.rows "
        "held-out ones (labelled as training windows in the results); refused otherwise when a model "
        "this run trained is scored",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(default="auto", description="as train.precision")
    needle: NeedleEvalConfig | None = Field(
        default_factory=NeedleEvalConfig, description="the needle grid; null: loss by position only"
    )
    baseline: str = Field(
        default="base",
        min_length=1,
        description="the model the short-context guard measures the others against (a label of eval.models, "
        "or base, trained or a checkpoint folder, then evaluated too): its short-window loss is the "
        "guard's denominator",
    )
    effective: EffectiveLengthConfig = Field(default_factory=EffectiveLengthConfig)
    short_context: ShortContextConfig | None = Field(
        default=None, description="the short-context guard; null: not measured"
    )

    @field_validator("shards", "documents", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, value: list[str]) -> list[str]:
        if len(set(value)) < len(value):
            raise ValueError(f"a model is listed twice: {value}")
        return value

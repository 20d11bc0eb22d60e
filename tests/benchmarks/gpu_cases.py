"""A configuration of the GPU suite's training section (``gpu_training.run_training``), in a module of its
own so that ``gpu_suite.py`` can describe its cases before it imports anything of longctx (it first checks
that the installed longctx is this checkout's)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrainCase:
    """One configuration: a model shape of the settings (``train_models``), a window length, the
    ``train.activation_checkpointing`` setting and ``train.kernels``; ``profile`` adds a profiled step."""

    name: str
    model: str
    tokens: int
    checkpointing: str = "auto"
    kernels: dict = field(default_factory=dict)
    profile: bool = False

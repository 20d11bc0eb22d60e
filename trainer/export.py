"""Export the trained model as a Hugging Face folder that ``transformers`` opens as it is.

The folder holds the weights (``huggingface_hub``'s safetensors shards and index, see
``hf_io.write_checkpoint``), ``config.json`` with the trained RoPE scaling and
``max_position_embeddings`` = the target context, and the tokenizer: ``tokenizer.json`` (the one the
shards were packed with) and ``tokenizer_config.json`` with its special tokens (the base checkpoint's,
when it has one, with ``model_max_length`` set to the target context), so that both
``AutoTokenizer.from_pretrained(folder)`` and ``AutoModelForCausalLM.from_pretrained(folder)`` work.

Sharded parameters are gathered one at a time (``DTensor.full_tensor``, a collective) and kept, cast
to the export dtype, on rank 0 only, which writes the folder atomically.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from longctx.core.atomic import atomic_path
from longctx.core.errors import OutputError
from longctx.core.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN
from longctx.trainer.hf_io import write_checkpoint
from longctx.trainer.model import Transformer
from longctx.trainer.parallel import ParallelState, first_problem

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def full_state_dict(model: Transformer, state: ParallelState, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every parameter, whole and cast to ``dtype``, on rank 0 (an empty dict on the other ranks).

    Collective: every rank gathers each sharded parameter in turn, so beyond rank 0's copy the
    memory is one full parameter at a time.
    """
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        if state.is_main:
            # a new tensor owning its storage (gathered ones can be views of padded buffers)
            tensors[name] = full.detach().to(device="cpu", dtype=dtype, copy=True)
        del full
    return tensors


def tokenizer_config(tokenizer: Path, max_length: int) -> dict[str, Any]:
    """A ``tokenizer_config.json`` for a bare ``tokenizer.json``: the fast tokenizer class and the
    special tokens longctx's tokenizers use, where the vocabulary has them."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab(with_added_tokens=True)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    for key, token in (("bos_token", BOS_TOKEN), ("eos_token", EOS_TOKEN), ("pad_token", PAD_TOKEN)):
        if token in vocab:
            config[key] = token
    return config


def _special_token_ids(config: dict[str, Any], tokenizer: Path) -> dict[str, int]:
    """``bos_token_id``/``eos_token_id``/``pad_token_id`` for config.json, from the tokenizer config."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab(with_added_tokens=True)
    ids = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in vocab:
            ids[f"{key}_id"] = vocab[token]
    return ids


def write_tokenizer(folder: Path, tokenizer: Path, base: Path | None, max_length: int) -> dict[str, int]:
    """Write the tokenizer files into ``folder``; returns the special token ids for config.json."""
    shutil.copyfile(tokenizer, folder / TOKENIZER_FILE)
    base_config = base / TOKENIZER_CONFIG if base is not None else None
    if base_config is not None and base_config.is_file():
        config = json.loads(base_config.read_text())
        config["model_max_length"] = max_length
        if (base / SPECIAL_TOKENS_MAP).is_file():
            shutil.copyfile(base / SPECIAL_TOKENS_MAP, folder / SPECIAL_TOKENS_MAP)
    else:
        config = tokenizer_config(tokenizer, max_length)
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return _special_token_ids(config, tokenizer)


def export_bytes(model: Transformer, dtype: torch.dtype, tokenizer: Path | None) -> int:
    """About what :func:`export_model` writes: every parameter in ``dtype``, and the tokenizer."""
    weights = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    return weights + (tokenizer.stat().st_size if tokenizer is not None else 0)


def export_model(
    model: Transformer,
    folder: Path,
    state: ParallelState,
    *,
    dtype: torch.dtype,
    tokenizer: Path | None,
    base: Path | None,
    max_shard_size: str,
) -> Path:
    """Write ``model`` as a Hugging Face folder at ``folder`` (replacing an earlier export there).

    Collective. ``base`` is the Hugging Face checkpoint training started from (its tokenizer config
    is reused), ``tokenizer`` the run's ``tokenizer.json``. A disk that cannot take the folder is an
    :class:`OutputError` on every rank naming it and the space it takes: before the weights are
    gathered when too little is free, or when rank 0's write fails (nothing of the folder is kept);
    the ranks agree on it through a collective, so none waits on another.
    """
    from longctx.core.preflight import check_free_space, space_fault

    needed, what = export_bytes(model, dtype, tokenizer), "the exported model"

    def on_main(work: Callable[[], None]) -> None:
        """``work()`` on rank 0; a disk fault it meets is raised on every rank."""
        problem = None
        if state.is_main:
            try:
                work()
            except OSError as err:
                fault = space_fault(err, folder, needed, what)
                if fault is None:
                    raise
                problem = str(fault)
        problem = first_problem(problem, state)
        if problem is not None:
            raise OutputError(problem)

    on_main(lambda: check_free_space(folder.parent, needed, what))
    tensors = full_state_dict(model, state, dtype)

    def write() -> None:
        with atomic_path(folder) as staging:
            staging.mkdir()
            write_checkpoint(model.config, tensors, staging, dtype=dtype, max_shard_size=max_shard_size)
            if tokenizer is not None:
                ids = write_tokenizer(staging, tokenizer, base, model.config.max_position_embeddings)
                config_path = staging / "config.json"
                config = json.loads(config_path.read_text())
                config.update({key: value for key, value in ids.items() if config.get(key) is None})
                config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    on_main(write)
    return folder

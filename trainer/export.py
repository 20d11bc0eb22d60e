"""Export the trained model as a Hugging Face folder that ``transformers`` opens as it is.

The folder holds the weights (``huggingface_hub``'s safetensors shards and index, see
``weights.write_checkpoint``, under the names ``save_pretrained`` writes), ``config.json`` with the
trained RoPE scaling and ``max_position_embeddings`` = the target context, the tokenizer and how to stop
generating:

- ``tokenizer.json``: the one the shards were packed with;
- ``tokenizer_config.json`` (special tokens, chat template, ``model_max_length`` set to the target
  context): the run's own (the one curation copied beside the run's ``tokenizer.json``, e.g. from a
  hub repository), else the base checkpoint's, else one declaring what the tokenizer itself declares
  (its post-processor's or a conventional end-of-text token); with ``chat_template.jinja`` from the
  same place;
- ``generation_config.json``: the base checkpoint's (sampling settings), with the tokenizer's
  ``eos_token_id`` (the base's list of end ids when it holds the tokenizer's), ``bos_token_id`` and
  ``pad_token_id``, so that ``generate`` stops at the end of a document,

so that ``AutoTokenizer.from_pretrained(folder)``, ``AutoModelForCausalLM.from_pretrained(folder)``
and ``GenerationConfig.from_pretrained(folder)`` work.

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
from longctx.core.errors import ConfigError, OutputError
from longctx.core.tokenizer import (
    BOS_TOKEN,
    CHAT_TEMPLATE_FILE,
    PAD_TOKEN,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    document_specials,
    load_tokenizer,
)
from longctx.trainer.models.files import CONFIG_NAME
from longctx.trainer.models.interface import TrainedModel
from longctx.trainer.models.weights import loadable_tensors, write_checkpoint
from longctx.trainer.parallel.state import ParallelState, first_problem

SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def full_state_dict(model: TrainedModel, state: ParallelState, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer (``weights.loadable_tensors``), whole, floating-point ones
    cast to ``dtype``, on rank 0 (an empty dict on the other ranks).

    Collective: every rank gathers each sharded parameter in turn, so beyond rank 0's copy the
    memory is one full parameter at a time.
    """
    tensors: dict[str, torch.Tensor] = {}
    for name, param in loadable_tensors(model).items():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        if state.is_main:
            cast = dtype if full.is_floating_point() else full.dtype
            # a new tensor owning its storage (gathered ones can be views of padded buffers)
            tensors[name] = full.detach().to(device="cpu", dtype=cast, copy=True)
        del full
    return tensors


def tokenizer_config(tokenizer: Path, max_length: int) -> dict[str, Any]:
    """A ``tokenizer_config.json`` for a bare ``tokenizer.json``: the fast tokenizer class and the
    special tokens the tokenizer declares (its end-of-text token: the post-processor's or a
    conventional one; its beginning token when the post-processor prepends one), and longctx's own
    BOS and padding tokens where the vocabulary has them."""
    vocab = load_tokenizer(tokenizer).get_vocab(with_added_tokens=True)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    try:
        declared = document_specials(tokenizer)
        eos, bos = declared.eos, declared.bos
    except ConfigError:  # no end-of-text token anywhere: the folder declares none either
        eos, bos = None, None
    tokens = {
        "bos_token": bos or (BOS_TOKEN if BOS_TOKEN in vocab else None),
        "eos_token": eos,
        "pad_token": PAD_TOKEN if PAD_TOKEN in vocab else None,
    }
    config.update({key: token for key, token in tokens.items() if token is not None})
    return config


def _special_token_ids(config: dict[str, Any], tokenizer: Path) -> dict[str, int]:
    """``bos_token_id``/``eos_token_id``/``pad_token_id`` for config.json, from the tokenizer config."""
    vocab = load_tokenizer(tokenizer).get_vocab(with_added_tokens=True)
    ids = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in vocab:
            ids[f"{key}_id"] = vocab[token]
    return ids


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def write_tokenizer(folder: Path, tokenizer: Path, base: Path | None, max_length: int) -> dict[str, int]:
    """Write the tokenizer files into ``folder``: ``tokenizer.json``, and the ``tokenizer_config.json``
    (with ``chat_template.jinja``) of the run (beside ``tokenizer``), else of ``base``, else one
    made for it; ``model_max_length`` is ``max_length``. Returns the special token ids."""
    shutil.copyfile(tokenizer, folder / TOKENIZER_FILE)
    origin = next(
        (
            place
            for place in (tokenizer.parent, base)
            if place is not None and (place / TOKENIZER_CONFIG_FILE).is_file()
        ),
        None,
    )
    if origin is not None:
        config = _read_json(origin / TOKENIZER_CONFIG_FILE)
        config["model_max_length"] = max_length
        for name in (CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_MAP):
            if (origin / name).is_file():
                shutil.copyfile(origin / name, folder / name)
    else:
        config = tokenizer_config(tokenizer, max_length)
    (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return _special_token_ids(config, tokenizer)


def generation_config(ids: dict[str, int], base: Path | None) -> dict[str, Any]:
    """``generation_config.json``: the base checkpoint's, with the tokenizer's special token ``ids``.
    The end ids stay the base's when they include the tokenizer's end token (an instruct model stops
    at several); otherwise they are the tokenizer's, the token every packed document ended with."""
    config = (
        _read_json(base / GENERATION_CONFIG)
        if base is not None and (base / GENERATION_CONFIG).is_file()
        else {}
    )
    for key in ("bos_token_id", "pad_token_id"):
        if key in ids:
            config[key] = ids[key]
    if "eos_token_id" in ids:
        theirs = config.get("eos_token_id")
        listed = theirs if isinstance(theirs, list) else [theirs]
        if ids["eos_token_id"] not in listed:
            config["eos_token_id"] = ids["eos_token_id"]
    return config


def export_bytes(model: TrainedModel, dtype: torch.dtype, tokenizer: Path | None) -> int:
    """About what :func:`export_model` writes: every parameter in ``dtype``, and the tokenizer."""
    weights = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    return weights + (tokenizer.stat().st_size if tokenizer is not None else 0)


def export_model(
    model: TrainedModel,
    folder: Path,
    state: ParallelState,
    *,
    dtype: torch.dtype,
    tokenizer: Path | None,
    base: Path | None,
    max_shard_size: str,
) -> Path:
    """Write ``model`` as a Hugging Face folder at ``folder`` (replacing an earlier export there).

    Collective. ``base`` is the Hugging Face checkpoint training started from (its tokenizer and
    generation configs are reused where the run has none), ``tokenizer`` the run's ``tokenizer.json``.
    A disk that cannot take the folder is an :class:`OutputError` on every rank naming it and the
    space it takes: before the weights are gathered when too little is free, or when rank 0's write
    fails (nothing of the folder is kept); the ranks agree on it through a collective, so none waits
    on another.
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
            stored = model.checkpoint_tensors(tensors)
            write_checkpoint(
                model.config.to_hf(), stored, staging, dtype=dtype, max_shard_size=max_shard_size
            )
            if tokenizer is not None:
                ids = write_tokenizer(staging, tokenizer, base, model.config.max_position_embeddings)
                config_path = staging / CONFIG_NAME
                config = json.loads(config_path.read_text())
                config.update({key: value for key, value in ids.items() if config.get(key) is None})
                config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
                generation = generation_config(ids, base)
                if generation:
                    (staging / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")

    on_main(write)
    return folder

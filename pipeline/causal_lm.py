"""A Hugging Face causal LM that curation runs (the model-based dependency score,
:mod:`longctx.pipeline.dependency_model`): found, checked and loaded.

A model is named by a local folder, or by a hub id (``org/name[@revision]``) already in the Hugging Face
hub cache: curation never downloads one. It is checked without loading its weights
(:func:`inspect_causal_lm`), so that a wrong value is refused in one line before a run writes anything,
then loaded once per process (:func:`load_causal_lm`). Nothing in its folder is ever executed: its
``config.json`` must name an architecture of the installed transformers (``trust_remote_code=False``),
and only safetensors weights are read (unpickling can run code).

torch and transformers (the ``transformers`` extra) are imported inside the functions that use them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.config import missing_extra
from longctx.core.errors import ConfigError
from longctx.core.tokenizer import looks_like_hub_id

CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which any one means the folder brings its own tokenizer."""
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


@dataclass(frozen=True)
class CausalLMInfo:
    """What curation knows of a model before loading it."""

    folder: Path
    """The local folder (a hub id's snapshot in the hub cache)."""
    model_type: str
    vocab_size: int
    max_positions: int | None
    """The model's ``max_position_embeddings`` (or ``n_positions``); None when it declares none."""
    has_tokenizer: bool
    """Whether the folder holds its own tokenizer (:data:`TOKENIZER_FILES`)."""


def _hub_snapshot(spec: str) -> Path | None:
    """The folder of hub id ``spec`` in the Hugging Face hub cache, None when the cache lacks it;
    nothing is downloaded."""
    from huggingface_hub import snapshot_download

    repo_id, _, revision = spec.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError, or a cache entry without the revision
        return None


def locate_model(spec: str) -> Path:
    """The folder named by ``spec``: a local folder, or a hub id's snapshot in the hub cache; a
    ``ValueError`` saying why when there is none."""
    local = Path(spec).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise ValueError(f"{spec} is a file, not a model folder")
    if not looks_like_hub_id(spec):
        raise ValueError(f"{spec} does not exist (nor is it a Hugging Face hub id such as org/name)")
    folder = _hub_snapshot(spec)
    if folder is None:
        from huggingface_hub import constants

        raise ValueError(
            f"{spec} is not a local folder, and the Hugging Face hub cache {constants.HF_HUB_CACHE} does not "
            f"hold it; curation downloads nothing: fetch it first (hf download {spec.partition('@')[0]})"
        )
    return folder


def _check_weights(folder: Path) -> None:
    """Refuse a folder without safetensors weights: pickle files can run code when loaded."""
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder} holds only pickle weights ({', '.join(pickles)}), which can run code when loaded; "
            "curation reads safetensors only (save_pretrained(..., safe_serialization=True))"
        )
    raise ValueError(f"{folder} holds no weights (*.safetensors)")


def _read_config(folder: Path) -> Any:
    """The folder's transformers config, for an architecture the installed transformers has as a
    causal LM (never the folder's own code)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{folder} has no {CONFIG_FILE}: not a Hugging Face model folder")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        own_code = ""
        if "auto_map" in raw:
            own_code = " (its auto_map names code in the folder, which curation never runs)"
        raise ValueError(
            f"{path}: model_type {model_type!r} is not a causal LM architecture of the installed "
            f"transformers {transformers.__version__}{own_code}"
        )
    try:
        return transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # a value its config class refuses
        raise ValueError(f"{path} cannot be read by transformers: {_first_line(err)}") from None


def _check_tokenizer(folder: Path) -> None:
    """Refuse a tokenizer in the folder that transformers cannot load."""
    try:
        load_model_tokenizer(str(folder))
    except Exception as err:
        raise ValueError(f"the tokenizer in {folder} cannot be loaded: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def inspect_causal_lm(spec: str, key: str) -> CausalLMInfo:
    """Find and check the model named by ``spec`` without loading its weights: a :class:`ConfigError`
    of one line naming ``key`` when transformers is missing, when ``spec`` names no folder (nor a hub id
    in the cache), or when the folder has no ``config.json``, no architecture transformers runs as a
    causal LM, no safetensors weights, or a tokenizer transformers cannot load."""
    missing = missing_extra("transformers", "transformers")
    if missing is not None:
        raise ConfigError(f"{key}: {missing}")
    try:
        folder = locate_model(spec)
        config = _read_config(folder)
        _check_weights(folder)
        has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
        if has_tokenizer:
            _check_tokenizer(folder)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return CausalLMInfo(
        folder=folder,
        model_type=config.model_type,
        vocab_size=int(text.vocab_size),
        max_positions=int(positions) if positions else None,
        has_tokenizer=has_tokenizer,
    )


def model_fingerprint(folder: Path) -> str:
    """sha256 of what identifies a model folder without reading its weights: its config and tokenizer
    files, and the names and sizes of its safetensors files."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, *TOKENIZER_FILES):
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    for weights in sorted(folder.glob("*.safetensors")):
        digest.update(f"{weights.name}\0{weights.stat().st_size}\0".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def load_causal_lm(folder: str, device: str) -> Any:
    """The model of ``folder`` on ``device``, in inference mode (bfloat16 on a GPU that has it, else
    float32), loaded once per process: the tasks a worker runs one after another share it."""
    import torch
    import transformers

    dtype = torch.float32
    if device.startswith("cuda"):
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=dtype
    )
    return model.to(device).eval()


@functools.lru_cache(maxsize=1)
def load_model_tokenizer(folder: str) -> Any:
    """The folder's own tokenizer (transformers' ``AutoTokenizer``, never the folder's code), once per
    process."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)

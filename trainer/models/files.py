"""A Hugging Face model folder: its file names, when it is finished, and whether it can be read.

A folder is ``config.json`` plus safetensors weights, one ``model.safetensors`` or
``model-00001-of-0000N.safetensors`` shards with ``model.safetensors.index.json`` mapping every tensor
name to its file, exactly as ``save_pretrained`` writes it. Only safetensors are read: pickle-based
``pytorch_model.bin`` files can execute code when loaded and are refused with a message.

**A model folder is finished when it has its** ``config.json``: every writer here (the export, the final
model of a run or stage, a publication to object storage) writes the weights first and the config
last, so :func:`is_model_folder` is the one test of "this model is there". Nothing here imports torch
(configs are validated by every command).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from longctx.core.errors import LongctxError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class ModelFolderError(LongctxError):
    """A Hugging Face checkpoint folder that cannot be read: a missing, unreadable or truncated file."""


def is_model_folder(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a finished model (its ``config.json``, written last)."""
    return (Path(directory) / CONFIG_NAME).is_file()


def config_json(directory: str | os.PathLike[str]) -> dict:
    """The ``config.json`` dict of the checkpoint in ``directory`` (``FileNotFoundError`` without one)."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {directory}")
    return json.loads(path.read_text())


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of the checkpoint in ``directory``: the shards of the index, or the single file.

    Raises ``ValueError`` when the directory only holds pickle weights, and ``FileNotFoundError``
    when it holds none (or the index names a missing shard).
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = []
        for name in sorted(set(weight_map.values())):
            if Path(name).name != name:
                raise ValueError(f"{index} names a shard outside the checkpoint directory: {name!r}")
            if not (root / name).is_file():
                raise FileNotFoundError(f"{index} names {name}, which is missing")
            files.append(root / name)
        return files
    if (root / WEIGHTS_NAME).is_file():
        return [root / WEIGHTS_NAME]
    pickles = sorted(p.name for p in root.glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{directory} holds only pickle weights ({', '.join(pickles)}); longctx loads safetensors only, "
            "because unpickling can run arbitrary code. Convert the checkpoint to safetensors from a trusted "
            "environment (e.g. save_pretrained(..., safe_serialization=True))."
        )
    raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {directory}")


def stored_names(files: list[Path]) -> dict[str, Path]:
    """Tensor name -> file holding it, across all files; a name stored twice is a ``ValueError``."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if name in where:
                    raise ValueError(f"tensor {name} is stored in both {where[name].name} and {file.name}")
                where[name] = file
    return where


def check_model_folder(directory: str | os.PathLike[str]) -> None:
    """Refuse, in one line naming the file, a checkpoint folder whose ``config.json`` is missing or
    unreadable (what it says is for the implementation that reads it: ``build.check_training_model``),
    whose index names missing shards, or whose safetensors files do not hold what their
    headers describe (a truncated copy): safetensors checks that when it opens a file, which reads
    only the header. Run before any weight is read, so a damaged folder is not met halfway."""
    from safetensors import SafetensorError, safe_open

    root = Path(directory)
    config = root / CONFIG_NAME
    try:
        settings = config_json(root)
    except FileNotFoundError:
        raise ModelFolderError(
            f"{config} is missing: {root} is not a Hugging Face checkpoint folder"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFolderError(f"{config} cannot be read ({err})") from None
    if not isinstance(settings, dict):
        raise ModelFolderError(f"{config}: not a JSON object")
    try:
        files = weight_files(root)
    except json.JSONDecodeError as err:
        raise ModelFolderError(f"{root / INDEX_NAME} cannot be read ({err})") from None
    except (OSError, ValueError) as err:
        raise ModelFolderError(str(err)) from None
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError as err:
            reason = str(err).removeprefix("Error while deserializing header: ")
            raise ModelFolderError(
                f"{file}: not a complete safetensors file ({reason}); the folder is damaged: export or copy "
                "it again"
            ) from None
    try:
        stored_names(files)
    except ValueError as err:
        raise ModelFolderError(f"{root}: {err}") from None

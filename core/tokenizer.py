"""Finding, loading and naming the run's tokenizer, and the special tokens documents are framed with.

Every part reads the same ``tokenizer.json``: curation counts tokens with it, the packer encodes with
it and records its fingerprint in every shard, and the trainer refuses shards made with another one.
(Training a small BPE for the demo is curation's job: ``longctx.pipeline.bpe``.)

* :func:`resolve_tokenizer` turns ``tokenizer.path`` (a ``tokenizer.json`` file, a folder holding
  one, or a Hugging Face hub id such as ``meta-llama/Meta-Llama-3-8B``, optionally ``@revision``) into
  local files (the ``tokenizer.json``, and the ``tokenizer_config.json`` and ``chat_template.jinja``
  beside it when there are), through ``huggingface_hub``'s cache (which honours ``HF_HOME``,
  ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``).
* :func:`document_specials` says which end-of-document, beginning-of-document and padding tokens
  frame each document, from the explicit settings or else what the tokenizer itself declares: its
  ``tokenizer_config.json`` beside the ``tokenizer.json`` (``eos_token``, ``bos_token``,
  ``add_bos_token``, ``pad_token``), else its post-processor's template, else a conventional
  end-of-text token among its special tokens. Curation checks it before any work; pack uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from longctx.core.errors import ConfigError

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# transformers >= 4.47 saves a tokenizer's chat template in this file instead of tokenizer_config.json
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# End-of-text tokens of well-known tokenizer families, tried in order when nothing else declares one.
CONVENTIONAL_EOS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|end|>", "[SEP]")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?$")


@dataclass(frozen=True)
class TokenizerFiles:
    """Local files of a tokenizer: its ``tokenizer.json`` and, when it has them, the
    ``tokenizer_config.json`` and ``chat_template.jinja`` beside it. ``origin`` is what
    ``tokenizer.path`` said."""

    tokenizer: Path
    config: Path | None
    origin: str
    chat_template: Path | None = None

    @classmethod
    def beside(cls, tokenizer: Path, origin: str) -> TokenizerFiles:
        """``tokenizer`` with the side files found in its folder."""
        config, template = tokenizer.with_name(TOKENIZER_CONFIG_FILE), tokenizer.with_name(CHAT_TEMPLATE_FILE)
        return cls(
            tokenizer, config if config.is_file() else None, origin, template if template.is_file() else None
        )


def looks_like_hub_id(spec: str) -> bool:
    """Whether ``spec`` has the shape of a hub repository id (``org/name`` or ``org/name@revision``)."""
    return bool(_HUB_ID.match(spec))


def resolve_tokenizer(spec: str | os.PathLike, key: str = "tokenizer.path") -> TokenizerFiles:
    """The local files of the tokenizer named by ``spec``: a ``tokenizer.json`` file, a folder holding
    one, or a hub id fetched through ``huggingface_hub`` (its cache first; offline mode honoured).
    A :class:`ConfigError` naming ``key`` when none of these works."""
    text = str(spec)
    local = Path(text).expanduser()
    if local.is_file():
        return TokenizerFiles.beside(local, text)
    if local.is_dir():
        if not (local / TOKENIZER_FILE).is_file():
            raise ConfigError(f"{key}: the folder {local} has no {TOKENIZER_FILE}")
        return TokenizerFiles.beside(local / TOKENIZER_FILE, text)
    if not looks_like_hub_id(text):
        raise ConfigError(f"{key}: {text} is neither a tokenizer file, a folder, nor a Hugging Face hub id")
    return _from_hub(text, key)


def _from_hub(spec: str, key: str) -> TokenizerFiles:
    """The tokenizer files of a hub repository, in one ``snapshot_download`` of just those files: from
    the cache alone in offline mode; online, one listing of the repository (no retries when the hub
    cannot be reached, where each ``hf_hub_download`` would retry for about 24 s)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, _, revision = spec.partition("@")
    wanted = [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE]
    cache = constants.HF_HUB_CACHE
    try:
        folder = Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=wanted))
    except LocalEntryNotFoundError:
        at = f" at revision {revision}" if revision else ""
        if constants.HF_HUB_OFFLINE:
            raise ConfigError(
                f"{key}: {spec} is not a local path, and the Hugging Face hub cache {cache} does not hold "
                f"{repo_id}{at} while HF_HUB_OFFLINE is set: download it where the hub can be reached "
                f"(hf download {repo_id} {' '.join(wanted[:2])}), point HF_HUB_CACHE (or HF_HOME) at a "
                "cache that holds it, or unset HF_HUB_OFFLINE"
            ) from None
        raise ConfigError(
            f"{key}: {spec} is not a local path, the Hugging Face hub cannot be reached (check the network, "
            f"HF_ENDPOINT), and the hub cache {cache} does not hold {repo_id}{at}"
        ) from None
    except Exception as err:  # no such repository or revision, a gated one without a token...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"{key}: {spec} is not a local path, and its {TOKENIZER_FILE} could not be had from the "
            f"Hugging Face hub ({first})"
        ) from None
    if not (folder / TOKENIZER_FILE).is_file():
        raise ConfigError(
            f"{key}: the Hugging Face repository {spec} has no {TOKENIZER_FILE}"
            + (f" in the hub cache {cache} (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else "")
        )
    return TokenizerFiles.beside(folder / TOKENIZER_FILE, spec)


@dataclass(frozen=True)
class SpecialTokens:
    """The tokens that frame every document: ``eos`` after it, ``bos`` before it (None: nothing
    before), ``pad`` to fill a window's unused tail (None: the EOS token), with their ids, and where
    the EOS token came from (``origin``)."""

    eos: str
    eos_id: int
    bos: str | None
    bos_id: int | None
    pad: str | None
    pad_id: int | None
    origin: str


def _token_content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_tokenizer_config(tokenizer_path: str | os.PathLike) -> dict[str, Any]:
    """The ``tokenizer_config.json`` beside a ``tokenizer.json`` (empty when there is none)."""
    config = Path(tokenizer_path).with_name(TOKENIZER_CONFIG_FILE)
    if not config.is_file():
        return {}
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{config}: not a readable JSON file ({err})") from None
    return data if isinstance(data, dict) else {}


def _template_specials(tokenizer: Tokenizer) -> tuple[str | None, str | None]:
    """The special tokens the post-processor puts before and after a single sequence, if any."""
    try:
        processor = json.loads(tokenizer.to_str()).get("post_processor") or {}
    except ValueError:
        return None, None
    processors = (
        processor.get("processors", [processor]) if processor.get("type") == "Sequence" else [processor]
    )
    for proc in processors:
        if proc.get("type") != "TemplateProcessing":
            continue
        single = proc.get("single") or []
        ids = [item.get("SpecialToken", {}).get("id") for item in single]
        first = ids[0] if ids and "Sequence" not in single[0] else None
        last = ids[-1] if ids and "Sequence" not in single[-1] else None
        return first, last
    return None, None


def document_specials(
    tokenizer_path: str | os.PathLike,
    *,
    eos: str | None = None,
    bos: str | None = None,
    add_bos: bool | None = None,
    pad: str | None = None,
    key: str = "pack",
    tokenizer: Tokenizer | None = None,
) -> SpecialTokens:
    """The special tokens that frame documents for the tokenizer at ``tokenizer_path``.

    Explicit settings win. Otherwise: EOS is ``eos_token`` of the ``tokenizer_config.json`` beside
    the file, else the token the tokenizer's post-processor appends, else the first of
    :data:`CONVENTIONAL_EOS` among its special tokens. BOS is used when ``add_bos`` (or, when it is
    None: ``bos`` is given, or the config's ``add_bos_token``; without that key, whether the
    post-processor prepends a token) says so: ``bos``, else the config's ``bos_token``, else the
    post-processor's first token. PAD is ``pad``, else the config's ``pad_token``, else None (the EOS pads).
    Each chosen token must be in the vocabulary: a :class:`ConfigError` naming ``{key}.eos_token`` (etc.)
    otherwise.
    ``tokenizer``: the one at ``tokenizer_path`` when the caller has it loaded already.
    """
    path = Path(tokenizer_path)
    tokenizer = load_tokenizer(path) if tokenizer is None else tokenizer
    config = read_tokenizer_config(path)
    lead, trail = _template_specials(tokenizer)
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]

    origin = "config"
    if eos is None:
        eos, origin = _token_content(config.get("eos_token")), TOKENIZER_CONFIG_FILE
        if eos is None and trail is not None:
            eos, origin = trail, "post_processor"
        if eos is None:
            eos = next((t for t in CONVENTIONAL_EOS if t in specials), None)
            origin = "conventional"
        if eos is None:
            raise ConfigError(
                f"{key}.eos_token: {path} declares no end-of-document token (no {TOKENIZER_CONFIG_FILE} "
                f"eos_token, none in its post-processor, none of {', '.join(CONVENTIONAL_EOS)}); set "
                f"{key}.eos_token to one of its special tokens: {', '.join(sorted(specials)) or '(none)'}"
            )
    if add_bos is None:  # an explicit BOS token is used; else what the tokenizer says
        add_bos = bos is not None or (
            bool(config["add_bos_token"]) if "add_bos_token" in config else lead is not None
        )
    if add_bos and bos is None:
        bos = _token_content(config.get("bos_token")) or lead
        if bos is None:
            raise ConfigError(f"{key}.bos_token: {path} declares no beginning-of-document token; set one")
    if not add_bos:
        bos = None
    if pad is None:
        pad = _token_content(config.get("pad_token"))
        if pad is not None and tokenizer.token_to_id(pad) is None:
            pad = None  # a config may name a pad token the vocabulary lacks; the EOS pads then

    def token_id(token: str | None, name: str) -> int | None:
        if token is None:
            return None
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ConfigError(
                f"{key}.{name}: {token!r} is not in the vocabulary of {path}; "
                f"its special tokens are: {', '.join(sorted(specials)) or '(none)'}"
            )
        return found

    return SpecialTokens(
        eos=eos,
        eos_id=token_id(eos, "eos_token"),  # type: ignore[arg-type]
        bos=bos,
        bos_id=token_id(bos, "bos_token"),
        pad=pad,
        pad_id=token_id(pad, "pad_token"),
        origin=origin,
    )


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a Hugging Face ``tokenizer.json``; a clear error when it is missing or not a tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"{path} is not a valid tokenizer.json: {err}") from err


def tokenizer_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of the ``tokenizer.json`` bytes: shards and curated counts name the tokenizer by it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Token counts without special tokens, encoded in one parallel batch."""
    return [len(enc.ids) for enc in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

"""Tokenizers named by a file, a folder or a hub id (an offline hub cache laid out here), and the
special tokens documents are framed with, taken from what each tokenizer declares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from longctx.core.errors import ConfigError
from longctx.core.tokenizer import document_specials, resolve_tokenizer
from longctx.pipeline.bpe import train_bpe

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = ["the quick brown fox jumps over the lazy dog " * 20, "def f(x):\n    return x + 1\n" * 20]


def make_tokenizer(
    folder: Path, specials: list[str], template: str | None = None, config: dict | None = None
) -> Path:
    """A small byte-level BPE with ``specials``, an optional post-processor ``template`` (TemplateProcessing
    ``single``) and an optional ``tokenizer_config.json`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    if template:
        used = [t for t in specials if t in template]
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, tok.token_to_id(t)) for t in used]
        )
    path = folder / "tokenizer.json"
    tok.save(str(path))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_trained_tokenizer_declares_its_own_specials(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    train_bpe(CORPUS, 300, path)
    found = document_specials(path)
    tok = Tokenizer.from_file(str(path))
    assert (found.eos, found.bos, found.pad) == ("<|endoftext|>", None, "<|pad|>")
    assert (found.eos_id, found.pad_id) == (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|pad|>"))
    assert found.origin == "tokenizer_config.json"


def test_llama3_style_tokenizer_without_config(tmp_path: Path) -> None:
    """Llama-3's tokenizer.json prepends <|begin_of_text|> in its post-processor and has no EOS there;
    its end-of-text token is found among its special tokens."""
    path = make_tokenizer(
        tmp_path, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|begin_of_text|> $A"
    )
    found = document_specials(path)
    tok = Tokenizer.from_file(str(path))
    assert (found.eos, found.bos, found.pad) == ("<|end_of_text|>", "<|begin_of_text|>", None)
    assert found.bos_id == tok.token_to_id("<|begin_of_text|>") and found.origin == "conventional"
    # the post-processor's own encoding agrees on the beginning token
    assert tok.encode("fox").ids[0] == found.bos_id


def test_tokenizer_config_wins_and_may_use_dict_tokens(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "special": True},
        "eos_token": {"content": "</s>"},
        "add_bos_token": True,
        "pad_token": "<unk>",
    }
    path = make_tokenizer(tmp_path, ["<unk>", "<s>", "</s>", "<|endoftext|>"], config=config)
    found = document_specials(path)
    assert (found.eos, found.bos, found.pad, found.origin) == (
        "</s>",
        "<s>",
        "<unk>",
        "tokenizer_config.json",
    )


def test_post_processor_eos_is_used_when_nothing_else_says(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path, ["[CLS]", "[END]"], "[CLS] $A [END]")
    found = document_specials(path)
    assert (found.eos, found.bos, found.origin) == ("[END]", "[CLS]", "post_processor")


def test_explicit_settings_win(tmp_path: Path) -> None:
    path = make_tokenizer(
        tmp_path, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|begin_of_text|> $A"
    )
    found = document_specials(path, eos="<|eot_id|>", add_bos=False)
    assert (found.eos, found.bos, found.origin) == ("<|eot_id|>", None, "config")
    quiet = make_tokenizer(
        tmp_path / "quiet", ["<s>", "</s>"], config={"eos_token": "</s>", "add_bos_token": False}
    )
    assert document_specials(quiet).bos is None
    assert document_specials(quiet, bos="<s>").bos == "<s>"  # a BOS set explicitly is used


def test_a_token_missing_from_the_vocabulary_is_named(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path, ["<|begin_of_text|>", "<|end_of_text|>"])
    with pytest.raises(
        ConfigError, match=r"pack\.eos_token: '<\|endoftext\|>' is not in the vocabulary .*<\|end_of_text\|>"
    ):
        document_specials(path, eos="<|endoftext|>")
    with pytest.raises(ConfigError, match=r"pack\.pad_token"):
        document_specials(path, pad="<pad>")


def test_no_end_token_anywhere_is_a_clear_error(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path, ["<mask>"])
    with pytest.raises(ConfigError, match=r"declares no end-of-document token.*set pack\.eos_token"):
        document_specials(path)


def test_tokenizer_named_by_file_or_folder(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path / "tok", ["<|endoftext|>"], config={"eos_token": "<|endoftext|>"})
    for spec in (path, path.parent):
        files = resolve_tokenizer(spec)
        assert files.tokenizer == path and files.config == path.parent / "tokenizer_config.json"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json"):
        resolve_tokenizer(tmp_path / "empty")
    with pytest.raises(ConfigError, match="neither a tokenizer file, a folder, nor a Hugging Face hub id"):
        resolve_tokenizer(tmp_path / "missing" / "deeper" / "tokenizer.json")


def lay_out_hub_cache(hub: Path, repo_id: str, files: dict[str, Path]) -> str:
    """A Hugging Face hub cache as huggingface_hub lays it out: blobs, a snapshot of symlinks, refs/main."""
    import hashlib

    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return commit


def _offline_env(hub: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}


def test_tokenizer_named_by_hub_id_from_an_offline_cache(tmp_path: Path) -> None:
    source = make_tokenizer(
        tmp_path / "src",
        ["<|begin_of_text|>", "<|end_of_text|>"],
        "<|begin_of_text|> $A",
        config={"eos_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>"},
    )
    hub = tmp_path / "hub"
    commit = lay_out_hub_cache(
        hub,
        "acme/tiny-tok",
        {"tokenizer.json": source, "tokenizer_config.json": source.with_name("tokenizer_config.json")},
    )
    script = (
        "import json, sys\nfrom longctx.core.tokenizer import resolve_tokenizer, document_specials\n"
        "f = resolve_tokenizer(sys.argv[1])\ns = document_specials(f.tokenizer)\n"
        "print(json.dumps([str(f.tokenizer), str(f.config), s.eos, s.bos]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, "acme/tiny-tok"],
        env=_offline_env(hub),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    tokenizer, config, eos, bos = json.loads(run.stdout)
    assert Path(tokenizer).read_bytes() == source.read_bytes()
    assert Path(tokenizer).parent.name == commit and Path(config).name == "tokenizer_config.json"
    assert (eos, bos) == ("<|end_of_text|>", "<|begin_of_text|>")
    # a pinned revision that the cache does not hold, and a repository it does not hold: one line each
    for spec in ("acme/tiny-tok@" + "0" * 40, "acme/not-cached"):
        run = subprocess.run(
            [sys.executable, "-c", script, spec],
            env=_offline_env(hub),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0
        assert f"tokenizer.path: {spec} is not a local path" in run.stderr.strip().splitlines()[-1]


def _resolve_in_subprocess(spec: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = (
        "import sys\nfrom longctx.core.tokenizer import resolve_tokenizer\n"
        "f = resolve_tokenizer(sys.argv[1])\nprint(f.tokenizer, f.config, f.chat_template)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, spec], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_chat_template_file_of_a_hub_tokenizer_comes_along(tmp_path: Path) -> None:
    source = make_tokenizer(tmp_path / "src", ["<s>", "</s>"], config={"eos_token": "</s>"})
    template = tmp_path / "src" / "chat_template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}</s>{% endfor %}")
    hub = tmp_path / "hub"
    lay_out_hub_cache(
        hub,
        "acme/chat-tok",
        {"tokenizer.json": source, "tokenizer_config.json": source.with_name("tokenizer_config.json")}
        | {"chat_template.jinja": template},
    )
    run = _resolve_in_subprocess("acme/chat-tok", _offline_env(hub))
    assert run.returncode == 0, run.stderr
    tokenizer, config, chat = run.stdout.split()
    assert Path(chat).read_text() == template.read_text()
    assert Path(chat).parent == Path(tokenizer).parent == Path(config).parent
    # and from a local folder
    found = resolve_tokenizer(tmp_path / "src")
    assert found.chat_template == template and found.config == source.with_name("tokenizer_config.json")


def test_a_hub_id_missing_offline_names_the_cache_and_hf_hub_offline(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    hub.mkdir()
    run = _resolve_in_subprocess("acme/not-cached", _offline_env(hub))
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert f"the Hugging Face hub cache {hub} does not hold acme/not-cached" in last, last
    assert "HF_HUB_OFFLINE is set" in last and "connection" not in last


def test_an_unreachable_hub_fails_at_once_naming_the_cache(tmp_path: Path) -> None:
    """Online with the hub out of reach (a closed port on loopback): no retries (each file download
    retried for about 24 s before), and the message names the cache that did not hold it."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub = tmp_path / "hub"
    hub.mkdir()
    env = _offline_env(hub) | {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    run = _resolve_in_subprocess("acme/not-cached", env)
    assert run.returncode != 0
    assert "Retrying" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "the Hugging Face hub cannot be reached" in last and f"hub cache {hub}" in last, last

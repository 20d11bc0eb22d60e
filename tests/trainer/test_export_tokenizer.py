"""The export keeps the tokenizer's own special tokens, chat template and end-of-generation ids, for a
tokenizer given by hub id (as transformers saves one, in an offline hub cache laid out here) and a
base model saved by ``save_pretrained`` without a tokenizer.

Reference: transformers itself (``AutoTokenizer``, ``GenerationConfig`` and ``generate``) reading the
hub tokenizer and the exported folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from longctx import jobs
from longctx.config import parse_config
from tests.core.test_tokenizer_specials import lay_out_hub_cache
from tests.packer.test_pack_helpers import synthetic_texts
from tests.trainer.conftest import save_random_llama

transformers = pytest.importorskip("transformers")

REPO = "acme/tiny-chat"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def hub_tokenizer(folder: Path, texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE with ``<s>``/``</s>``/``<pad>`` and a chat template, saved by transformers
    (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) as a hub repository holds it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|user|>", "<pad>", "<|assistant|>", "<s>", "</s>"],  # ids unlike Llama's 1, 2
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(folder)
    return fast


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache that huggingface_hub, in offline mode, reads in this process."""
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


@pytest.mark.slow
def test_export_keeps_a_hub_tokenizers_specials_chat_template_and_eos(
    offline_hub: Path, tmp_path: Path
) -> None:
    texts = synthetic_texts(seed=3)
    source = tmp_path / "saved"
    reference = hub_tokenizer(source, [t for docs in texts.values() for t in docs])
    lay_out_hub_cache(offline_hub, REPO, {p.name: p for p in source.iterdir()})
    corpus = tmp_path / "corpus" / "books"
    corpus.mkdir(parents=True)
    for i, text in enumerate(texts["books"] + texts["papers"]):
        (corpus / f"doc{i:02d}.txt").write_text(text)
    run = tmp_path / "run"
    base = save_random_llama(tmp_path / "base", len(reference))  # a model folder, no tokenizer files
    assert not (base / "tokenizer_config.json").exists()
    cfg = parse_config(
        {
            "output": str(run),
            "context": {"original": 128, "target": 512},
            "tokenizer": {"path": REPO},
            "curate": {"input": str(tmp_path / "corpus"), "executor": {"tasks": 1}},
            "pack": {"seq_lens": [256], "executor": {"tasks": 1}, "allow_short_positions": True},
            "train": {
                "shards": str(run / "shards" / "seq256"),
                "steps": 1,
                "coverage": {"required_position": 255},
                "model": {"hf_path": str(base)},
            },
        }
    )
    jobs.curate(cfg)
    assert (run / "chat_template.jinja").read_text() == (source / "chat_template.jinja").read_text()
    jobs.pack(cfg)
    final = jobs.train(cfg, progress=False).final_model

    exported = transformers.AutoTokenizer.from_pretrained(final)
    for name in ("bos_token", "eos_token", "pad_token"):
        assert getattr(exported, name) == getattr(reference, name), name
        assert getattr(exported, f"{name}_id") == getattr(reference, f"{name}_id"), name
    assert exported.model_max_length == 512  # context.target, not the base's 128 or the hub's
    messages = [{"role": "user", "content": "the quick fox"}]
    assert exported.chat_template == reference.chat_template
    assert exported.apply_chat_template(
        messages, add_generation_prompt=True
    ) == reference.apply_chat_template(messages, add_generation_prompt=True)
    generation = transformers.GenerationConfig.from_pretrained(final)
    assert generation.eos_token_id == reference.eos_token_id != 2  # not the random base's default
    assert (generation.bos_token_id, generation.pad_token_id) == (
        reference.bos_token_id,
        reference.pad_token_id,
    )

    # generate stops at the end token it finds in the folder: forced as the third new token here
    model = transformers.AutoModelForCausalLM.from_pretrained(final).eval()
    prompt = exported(texts["anchor"][0], return_tensors="pt").input_ids[:, :16]

    class EndAtThird(transformers.LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] == prompt.shape[1] + 2:
                scores[:] = -float("inf")
                scores[:, reference.eos_token_id] = 0.0
            return scores

    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=20, do_sample=False, logits_processor=[EndAtThird()], attention_mask=None
        )
    assert out.shape[1] == prompt.shape[1] + 3 and out[0, -1].item() == reference.eos_token_id
    config = json.loads((final / "config.json").read_text())
    assert config["max_position_embeddings"] == 512


def test_a_bare_tokenizer_json_exports_the_end_token_it_declares(tmp_path: Path) -> None:
    """No tokenizer config beside the run's tokenizer nor in the base: the end token is the one the
    tokenizer declares (here a conventional Llama-3 name, not longctx's own), as pack found it."""
    from longctx.core.tokenizer import document_specials
    from longctx.trainer.export import write_tokenizer
    from tests.core.test_tokenizer_specials import make_tokenizer

    tokenizer = make_tokenizer(
        tmp_path / "run", ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|> $A"
    )
    out = tmp_path / "out"
    out.mkdir()
    ids = write_tokenizer(out, tokenizer, None, 4096)
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded.eos_token == document_specials(tokenizer).eos == "<|end_of_text|>"
    assert loaded.bos_token == "<|begin_of_text|>" and loaded.model_max_length == 4096
    assert ids["eos_token_id"] == loaded.eos_token_id


def test_generation_ids_are_the_tokenizers_unless_the_base_already_stops_there(tmp_path: Path) -> None:
    from longctx.trainer.export import generation_config

    base = tmp_path / "base"
    base.mkdir()
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9], "temperature": 0.6}))
    ids = {"eos_token_id": 9, "bos_token_id": 1}
    # an instruct base that stops at several ids, the tokenizer's among them: kept, with its settings
    assert generation_config(ids, base) == {"eos_token_id": [7, 9], "temperature": 0.6, "bos_token_id": 1}
    # a base whose end ids are not the tokenizer's (a random model's defaults): the tokenizer's win
    assert generation_config({"eos_token_id": 4}, base) == {"eos_token_id": 4, "temperature": 0.6}
    assert generation_config({"eos_token_id": 4, "pad_token_id": 0}, None) == {
        "eos_token_id": 4,
        "pad_token_id": 0,
    }

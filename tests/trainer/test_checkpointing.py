"""Activation checkpointing (``longctx.trainer.models.checkpointing``) against no checkpointing, and the
memory
model (``longctx.trainer.planning.memory``) against what a block's forward really leaves alive.

- Gradients: ``selective`` and ``full`` give the loss and gradients of ``none`` in float64 (Llama with a
  tied embedding, Qwen2 with q/k/v biases; packed rows of several documents, chunked loss). ``selective``
  never runs the ring twice; ``full`` runs it again in backward.
- Memory: a dispatch mode records every storage the forward creates and, once the forward has returned,
  sums those still alive (kept for backward by autograd or by the checkpoint); one layer more adds
  exactly ``held_bytes_per_token x tokens`` bytes, in every mode, for float32, bf16 autocast over
  float32 weights (one unsharded process on a GPU) and bf16 weights (FSDP2's compute). For ``none``, the
  measure is checked against ``torch.autograd.graph.saved_tensors_hooks``, which sees every saved tensor.
- ``auto``: the cheapest mode that fits, as the device's memory shrinks.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.trainer.attention import ring
from longctx.trainer.models import checkpointing
from longctx.trainer.models.decoder import ModelConfig, Transformer
from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING
from longctx.trainer.planning import memory

TOKENS = 256
LENGTHS = [40, 1, 96, 119]  # documents of one packed row


def row(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, vocab, (1, TOKENS), generator=generator),
        "position_ids": torch.cat([torch.arange(n) for n in LENGTHS])[None],
        "token_index": torch.arange(TOKENS)[None],
        "segment_ids": torch.cat([torch.full((n,), s) for s, n in enumerate(LENGTHS)])[None],
    }


def tiny(model_type: str = "llama", layers: int = 2, **overrides) -> ModelConfig:
    dims = {"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2}
    return ModelConfig.tiny(model_type, num_hidden_layers=layers, **{**dims, **overrides})


@pytest.mark.parametrize(
    "config",
    [tiny("llama", tie_word_embeddings=True), tiny("qwen2")],
    ids=["llama-tied", "qwen2-qkv-bias"],
)
def test_checkpointing_gives_the_gradients_of_none_in_float64(config: ModelConfig, monkeypatch) -> None:
    inputs = row(config.vocab_size, seed=3)
    labels = torch.roll(inputs["input_ids"], -1, dims=1)
    labels[0, [39, 40, 136, -1]] = -100  # document ends predict nothing
    runs = []
    original = ring.ring_forward

    def counted(*args, **kwargs):
        runs[-1] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(ring, "ring_forward", counted)
    results = {}
    for mode in ("none", "selective", "full"):
        model = Transformer(config, activation_checkpointing=mode).double()
        model.init_weights(std=0.3, generator=torch.Generator().manual_seed(0))
        runs.append(0)
        loss = model.cross_entropy_sum(model(**inputs), labels, chunk_tokens=100)
        loss.backward()
        results[mode] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    loss, grads = results["none"]
    for mode in ("selective", "full"):
        assert torch.equal(results[mode][0], loss), mode
        for name, grad in grads.items():
            torch.testing.assert_close(results[mode][1][name], grad, rtol=0, atol=1e-12, msg=name)
    # forward runs the ring once per layer; full runs it again in backward, selective keeps its output
    layers = config.num_hidden_layers
    assert runs == [layers, layers, 2 * layers]


def test_recomputation_under_bf16_autocast_gives_the_same_gradients() -> None:
    """The GPU trainer's precision (bf16 autocast over float32 weights): recomputed casts and matmuls give
    the bits of the forward, so every mode's gradients are none's."""
    config = tiny("llama")
    inputs = row(config.vocab_size, seed=4)
    labels = torch.roll(inputs["input_ids"], -1, dims=1)
    results = {}
    for mode in ("none", "selective", "full"):
        model = Transformer(config, activation_checkpointing=mode)
        model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs, labels=labels).sum()
        loss.backward()
        results[mode] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    loss, grads = results["none"]
    for mode in ("selective", "full"):
        assert torch.equal(results[mode][0], loss), mode
        for name, grad in grads.items():
            assert torch.equal(results[mode][1][name], grad), (mode, name)


class LiveStorages(TorchDispatchMode):
    """Every storage an operator returns while active (parameters and their casts excepted); ``alive()``
    sums the bytes of those still referenced."""

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        super().__init__()
        self.skip = {p.untyped_storage().data_ptr() for p in parameters}
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else [out]
        weight_cast = (
            func is torch.ops.aten._to_copy.default and args[0].untyped_storage().data_ptr() in self.skip
        )
        for tensor in outputs:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            if weight_cast:  # autocast's bf16 copy of a weight: a parameter's, not an activation
                self.skip.add(storage.data_ptr())
            if storage.data_ptr() in self.skip:
                continue
            known = self.storages.get(storage.data_ptr())
            if known is None or known[0].expired():  # a freed storage's address may be reused
                self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive(self) -> int:
        gc.collect()
        return sum(size for ref, size in self.storages.values() if not ref.expired())


PRECISIONS = {
    # (compute bytes c, residual bytes r): parameters' dtype, autocast
    "float32": ((4, 4), torch.float32, False),
    "bf16-autocast": ((2, 4), torch.float32, True),
    "bf16-weights": ((2, 2), torch.bfloat16, True),
}


def held_by_forward(mode: str, layers: int, precision: str, hooks: bool = False) -> int:
    """Bytes a forward leaves alive for backward (or, with ``hooks``, that autograd saves) for the
    decoder of ``layers`` layers; the same input and weights' shapes otherwise."""
    _, dtype, autocast = PRECISIONS[precision]
    model = Transformer(tiny(layers=layers), activation_checkpointing=mode).to(dtype)
    inputs = row(model.config.vocab_size)
    cos, sin = model.rope_tables(inputs["position_ids"])
    rows = [ring_row(model, inputs)]
    embedded = model.model.embed_tokens(inputs["input_ids"]).detach().requires_grad_()
    live = LiveStorages(list(model.parameters()))
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if (
            not isinstance(tensor, torch.nn.Parameter)
            and tensor.untyped_storage().data_ptr() not in live.skip
        ):
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with live, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if hooks:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = run_layers(model, embedded, cos, sin, rows)
        else:
            out = run_layers(model, embedded, cos, sin, rows)
    held = sum(saved.values()) if hooks else live.alive()
    out.float().sum().backward()  # the kept tensors serve their purpose
    return held


def ring_row(model: Transformer, inputs: dict[str, torch.Tensor]):
    return model.attention.bind(inputs["token_index"][0], inputs["segment_ids"][0])


def run_layers(model: Transformer, x: torch.Tensor, cos, sin, rows) -> torch.Tensor:
    for layer in model.model.layers:
        x = layer(x, cos, sin, rows)
    return x


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_memory_model_counts_what_a_layer_keeps(mode: str, precision: str) -> None:
    (compute, residual), _, _ = PRECISIONS[precision]
    per_layer = held_by_forward(mode, 3, precision) - held_by_forward(mode, 2, precision)
    shape = tiny().shape
    assert per_layer == TOKENS * memory.held_bytes_per_token(shape, mode, compute, residual)
    if mode == "none":  # the measure agrees with autograd's own record of what it saves
        hooked = held_by_forward(mode, 3, precision, hooks=True) - held_by_forward(
            mode, 2, precision, hooks=True
        )
        assert hooked == per_layer


def test_selective_keeps_less_than_none_and_more_than_full() -> None:
    for shape in (tiny().shape, ModelConfig.tiny("llama", hidden_size=2048, intermediate_size=5632).shape):
        for compute, residual in ((2, 4), (2, 2)):
            kept = [
                memory.held_bytes_per_token(shape, mode, compute, residual)
                for mode in ACTIVATION_CHECKPOINTING
            ]
            assert kept == sorted(kept, reverse=True), (shape, kept)


def test_auto_picks_the_cheapest_mode_that_fits() -> None:
    from longctx.trainer.models.shape import ModelShape
    from longctx.trainer.planning.plan import PRESETS

    shape = ModelShape.from_hf(PRESETS["llama-3-8b"], "llama-3-8b")
    setting = {"state_shards": 8, "compute_bytes": 2}
    totals = {
        mode: memory.rank_memory(shape, 32768, 1, activation_checkpointing=mode, **setting).total
        for mode in ACTIVATION_CHECKPOINTING
    }
    assert totals["none"] > totals["selective"] > totals["full"]

    def device_for(estimate: float) -> float:  # the smallest device whose usable memory holds it
        return (estimate + memory.RESERVED_BYTES) / (1 - memory.HEADROOM_FRACTION)

    for device, expected in [
        (device_for(totals["none"]) * 1.01, "none"),
        (device_for(totals["none"]) * 0.99, "selective"),
        (device_for(totals["selective"]) * 1.001, "selective"),
        (device_for(totals["selective"]) * 0.999, "full"),
        (device_for(totals["full"]) * 1.001, "full"),
    ]:
        assert memory.choose_checkpointing(shape, 32768, 1, device, **setting) == expected, device / 2**30
    # nothing fits: full, which check_fits then refuses with the breakdown
    small = device_for(totals["full"]) * 0.9
    assert memory.choose_checkpointing(shape, 32768, 1, small, **setting) == "full"
    full = memory.rank_memory(shape, 32768, 1, activation_checkpointing="full", **setting)
    with pytest.raises(memory.ConfigError, match="does not fit"):
        memory.check_fits(full, small, where="a small GPU", settings="test")
    # unknown memory: the safe choice
    assert memory.choose_checkpointing(shape, 32768, 1, None, **setting) == "full"


def test_run_block_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="none, selective or full"):
        checkpointing.run_block(lambda x: x, "sometimes", torch.ones(2, requires_grad=True))

"""``train.kernels``: the choices, their start-up probes and their one-line fallbacks, on the CPU.

liger-kernel and the CUDA attention kernels cannot run here: asked for, they fall back with one line and
the model computes what PyTorch's ops compute. The probes themselves are checked against deliberately
wrong implementations. ``torch.compile`` runs here (Inductor's C++ backend): compiled blocks give the
loss and gradients of eager blocks, in one process and under a 2-rank ring on gloo (slow: compiling
takes minutes on two cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from longctx.trainer.attention.select import BACKENDS, attention_backend
from longctx.trainer.config import KernelsConfig
from longctx.trainer.models import fused
from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer
from longctx.trainer.models.kernels import apply_kernels
from longctx.trainer.parallel.zigzag import zigzag_indices
from tests.trainer.test_ring_attention import launch

CPU = torch.device("cpu")
TOKENS = 96
LENGTHS = [30, 1, 20, 45]


def test_config_offers_every_ring_backend() -> None:
    assert set(KernelsConfig.model_fields["attention"].annotation.__args__) == set(BACKENDS)


def test_liger_falls_back_on_the_cpu_with_one_line() -> None:
    ops, note = fused.fused_ops("liger", CPU)
    assert ops is fused.EAGER
    assert note is not None and "\n" not in note and note.startswith("train.kernels.fused liger: ")
    assert "liger-kernel" in note and note.endswith("using PyTorch's ops")
    # auto on a CPU and none say nothing: PyTorch's ops are what they ask for there
    assert fused.fused_ops("auto", CPU) == (fused.EAGER, None)
    assert fused.fused_ops("none", CPU) == (fused.EAGER, None)
    with pytest.raises(ValueError, match=r"train\.kernels\.fused"):
        fused.fused_ops("triton", CPU)


class _NoEps(fused.EagerOps):
    def rms_norm(self, x, weight, eps):
        return super().rms_norm(x, weight, 0.3)


class _Swapped(fused.EagerOps):
    def rotary(self, q, k, cos, sin):
        return super().rotary(q, k, sin, cos)


class _Sloppy(fused.EagerOps):
    def linear_cross_entropy(self, hidden, weight, labels, ignore_index):
        return F.cross_entropy(F.linear(hidden, weight).float() * 1.1, labels, reduction="none")


def test_the_fused_probe_accepts_the_reference_and_catches_wrong_kernels() -> None:
    dtypes = (torch.float32, torch.bfloat16)
    assert fused.probe(fused.EagerOps(), CPU, dtypes) is None
    for wrong, name in ((_NoEps(), "rms_norm"), (_Swapped(), "rope"), (_Sloppy(), "linear_cross_entropy")):
        failure = fused.probe(wrong, CPU, dtypes)
        assert failure is not None and failure.startswith(name), failure


@pytest.mark.parametrize(
    "backend", ["flash_attn4_varlen", "flash_attn_varlen", "torch_cudnn", "torch_efficient"]
)
def test_a_cuda_attention_kernel_falls_back_to_auto_on_the_cpu(backend: str) -> None:
    chosen, note = attention_backend(backend, CPU, torch.float32, 16, 4, 2)
    assert chosen == "auto" and note is not None and "\n" not in note
    assert note.startswith(f"train.kernels.attention {backend}: ") and "CUDA" in note
    assert attention_backend("math", CPU, torch.float32, 16, 4, 2) == ("math", None)


def row(vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "input_ids": torch.randint(0, vocab, (TOKENS,), generator=generator),
        "position_ids": torch.cat([torch.arange(n) for n in LENGTHS]),
        "token_index": torch.arange(TOKENS),
        "segment_ids": torch.cat([torch.full((n,), s) for s, n in enumerate(LENGTHS)]),
    }


def loss_and_grads(model: Transformer, inputs: dict[str, torch.Tensor], labels: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = model(**inputs, labels=labels, rope_seq_len=TOKENS).sum()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_fallbacks_leave_the_model_exact(capsys) -> None:
    config = ModelConfig.tiny("llama", num_hidden_layers=2)
    reference = Transformer(config)
    reference.init_weights(generator=torch.Generator().manual_seed(0))
    model = Transformer(config, activation_checkpointing="selective")
    model.load_state_dict(reference.state_dict())
    choice = apply_kernels(
        model, attention="torch_cudnn", fused="liger", compile_blocks=False, device=CPU, dtype=torch.float32
    )
    assert (choice.attention, choice.fused, choice.compiled) == ("auto", "none", False)
    assert [note.split(":")[0] for note in choice.notes] == [
        "train.kernels.attention torch_cudnn",
        "train.kernels.fused liger",
    ]
    inputs = row(config.vocab_size)
    labels = torch.roll(inputs["input_ids"], -1)
    expected_loss, expected = loss_and_grads(reference, inputs, labels)
    loss, grads = loss_and_grads(model, inputs, labels)
    assert torch.equal(loss, expected_loss)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-6, msg=name)


def test_compile_is_not_combined_with_selective_checkpointing() -> None:
    model = Transformer(ModelConfig.tiny("llama"), activation_checkpointing="selective")
    choice = apply_kernels(
        model, attention="auto", fused="none", compile_blocks=True, device=CPU, dtype=torch.float32
    )
    assert not choice.compiled and "selective" in choice.notes[0]
    assert not any(
        hasattr(layer.attention_inputs, "_torchdynamo_orig_callable") for layer in model.model.layers
    )


def _compiled_equals_eager(rank: int, world: int, cache: str, mode: str) -> None:
    """Each rank: its zigzag share of one window through eager and compiled blocks (the ring over the
    group between them); losses and gradients summed over the group must agree."""
    config = ModelConfig.tiny("llama", num_hidden_layers=2)
    group = dist.group.WORLD if world > 1 else None
    eager = Transformer(config, attention=RingAttention(group))
    eager.init_weights(generator=torch.Generator().manual_seed(0))
    compiled = Transformer(config, attention=RingAttention(group), activation_checkpointing=mode)
    compiled.load_state_dict(eager.state_dict())
    choice = apply_kernels(
        compiled,
        attention="auto",
        fused="none",
        compile_blocks=True,
        device=CPU,
        dtype=torch.float32,
        compile_cache=Path(cache),
    )
    assert choice.compiled, choice.notes
    inputs = row(config.vocab_size)
    labels = torch.roll(inputs["input_ids"], -1)
    rows = zigzag_indices(TOKENS, world, rank)
    share = {key: value[rows] for key, value in inputs.items()}
    results = [loss_and_grads(model, share, labels[rows]) for model in (eager, compiled)]
    if group is not None:
        for loss, grads in results:
            dist.all_reduce(loss, group=group)
            for grad in grads.values():
                dist.all_reduce(grad, group=group)
    (expected_loss, expected), (loss, grads) = results
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


def _compile_check(folder: str) -> None:
    """One process with full checkpointing around the compiled halves (it fills the cache), then 2 ranks
    without checkpointing, reading it. Run in a fresh interpreter (see the test)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache = Path(folder) / "compile_cache"
    _compiled_equals_eager(0, 1, str(cache), "full")
    assert Path(cache_dir()) == cache and any(cache.rglob("*"))
    launch(Path(folder), 2, _compiled_equals_eager, str(cache), "none", timeout_s=600)


@pytest.mark.slow
def test_compiled_blocks_give_the_loss_and_gradients_of_eager_ones(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """In a fresh interpreter whose TMPDIR is the test's own folder, so that what Inductor writes outside
    the run's cache (its C++ precompiled headers, under ``$TMPDIR/torchinductor_<user>``) stays there. The
    folder is a short one in /tmp: the process group's forkserver puts its Unix socket in TMPDIR, and under
    pytest-xdist the test's tmp_path is too deep for a socket path (107 bytes)."""
    tmp = Path(tempfile.mkdtemp(prefix="lc-compile-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(tmp)
    code = (
        "import sys; from tests.trainer.test_kernel_choice import _compile_check; _compile_check(sys.argv[1])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert any((tmp_path / "compile_cache").rglob("*.py"))  # Inductor's generated code: in the run's cache

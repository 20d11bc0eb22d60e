"""Block kernels and log-sum-exp merging, against float64 softmax attention written out here."""

from __future__ import annotations

import pytest
import torch

from longctx.trainer.attention.kernels import (
    CpuFlashKernel,
    MathKernel,
    block_backward,
    block_forward,
    kernel_calls,
)
from longctx.trainer.attention.masks import BlockMask, block_mask
from longctx.trainer.attention.merge import merge_into, normalize_empty_rows
from longctx.trainer.attention.ring import ring_attention
from longctx.trainer.attention.select import select_kernels

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    ),
]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}
NEG_INF = float("-inf")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float):
    """Float64 attention; ``allowed`` is ``[rows, cols]``; rows seeing nothing output 0 with lse -inf."""
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("rhd,chd->hrc", q, k.repeat_interleave(group, 1)) * scale
    scores = scores.masked_fill(~allowed, NEG_INF)
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("hrc,chd->rhd", probs, v.repeat_interleave(group, 1))
    return out, lse


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def random_block(device: str) -> BlockMask:
    """A 24 x 20 block of three documents with some queries that see no key at all."""
    q_index = torch.arange(20, 44, device=device)
    kv_index = torch.arange(0, 40, 2, device=device)
    q_segment = (q_index >= 30).long() + (q_index >= 38).long() * 5  # 0, 1 and 6; 6 has no keys
    kv_segment = (kv_index >= 30).long()
    block = block_mask(q_index, q_segment, kv_index, kv_segment, trim=False)
    assert block is not None and not bool(block.row_has_key.all())
    return block


def test_normalize_and_merge_treat_keyless_rows_as_nothing_seen() -> None:
    rows, heads, dim = 4, 2, 3
    seen_out = torch.randn(rows, heads, dim)
    seen_lse = torch.randn(heads, rows)
    # Rows 1..3 of the second block see no key; kernels report them as +inf (FlashAttention-2),
    # 0 with a zero output (PyTorch CPU flash), or NaN.
    block_out = torch.randn(rows, heads, dim)
    block_out[1] = 0.0
    block_out[3] = float("nan")
    block_lse = torch.randn(heads, rows)
    block_lse[:, 1] = 0.0
    block_lse[:, 2] = float("inf")
    block_lse[:, 3] = float("nan")
    row_has_key = torch.tensor([True, False, False, False])
    block_out, block_lse = normalize_empty_rows(block_out, block_lse, row_has_key)
    assert torch.isneginf(block_lse[:, 1:]).all() and (block_out[1:] == 0).all()

    out, lse = seen_out.clone(), seen_lse.clone()
    merge_into(out, lse, block_out, block_lse)
    assert torch.allclose(out[1:], seen_out[1:]) and torch.allclose(lse[:, 1:], seen_lse[:, 1:])
    expected_lse = torch.logaddexp(seen_lse[:, 0], block_lse[:, 0])
    assert torch.allclose(lse[:, 0], expected_lse)


def test_merge_of_two_empty_rows_stays_empty_without_nan() -> None:
    out = torch.zeros(2, 1, 3)
    lse = torch.full((1, 2), NEG_INF)
    merge_into(out, lse, torch.zeros(2, 1, 3), torch.full((1, 2), NEG_INF))
    assert torch.isneginf(lse).all() and (out == 0).all()
    # A later block that sees keys takes over exactly.
    block_out, block_lse = torch.randn(2, 1, 3), torch.randn(1, 2)
    merge_into(out, lse, block_out, block_lse)
    assert torch.allclose(out, block_out) and torch.allclose(lse, block_lse)


def test_merge_is_stable_for_large_log_sum_exps() -> None:
    out, lse = torch.ones(1, 1, 2), torch.tensor([[1000.0]])
    merge_into(out, lse, 3 * torch.ones(1, 1, 2), torch.tensor([[1000.0]]))
    assert torch.allclose(out, 2 * torch.ones(1, 1, 2))
    assert torch.allclose(lse, torch.tensor([[1000.0 + torch.log(torch.tensor(2.0)).item()]]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_block_kernels_match_reference(device: str, dtype: torch.dtype, backend: str) -> None:
    torch.manual_seed(0)
    block = random_block(device)
    rows, cols = block.shape
    scale = 0.3
    q = torch.randn(rows, 8, 16, device=device).to(dtype)
    k, v = (torch.randn(cols, 2, 16, device=device).to(dtype) for _ in range(2))
    kernel = select_kernels(torch.device(device), dtype, 16, 8, 2, backend)[0]
    out, lse = block_forward(kernel, q, k, v, block, scale)
    ref_out, ref_lse = reference(q, k, v, block.allowed(), scale)
    assert relative_error(out, ref_out) <= TOLERANCE[dtype]
    keyless = ~block.row_has_key
    assert torch.isneginf(lse[:, keyless]).all() and (out[keyless] == 0).all()
    assert relative_error(lse[:, ~keyless], ref_lse[:, ~keyless]) <= TOLERANCE[dtype]

    # Backward with a window-wide log-sum-exp larger than the block's: probabilities below one.
    window_lse = ref_lse + torch.rand_like(ref_lse)
    window_lse = torch.where(torch.isinf(window_lse), 1.0, window_lse)
    dout = torch.randn_like(q)
    window_out = torch.randn_like(q)
    dq, dk, dv = block_backward(kernel, dout, q, k, v, window_out, window_lse.to(lse.dtype), block, scale)
    probs = torch.exp(
        torch.einsum("rhd,chd->hrc", *(x.double() for x in (q, k.repeat_interleave(4, 1)))) * scale
        - window_lse[..., None]
    ).masked_fill(~block.allowed(), 0.0)
    dprobs = torch.einsum("rhd,chd->hrc", dout.double(), v.repeat_interleave(4, 1).double())
    dscores = probs * (dprobs - (dout.double() * window_out.double()).sum(-1).transpose(0, 1)[..., None])
    expected_dq = torch.einsum("hrc,chd->rhd", dscores, k.repeat_interleave(4, 1).double()) * scale
    expected_dk = torch.einsum("hrc,rhd->chd", dscores, q.double()).unflatten(1, (2, 4)).sum(2) * scale
    expected_dv = torch.einsum("hrc,rhd->chd", probs, dout.double()).unflatten(1, (2, 4)).sum(2)
    for actual, expected in ((dq, expected_dq), (dk, expected_dk), (dv, expected_dv)):
        assert relative_error(actual, expected) <= TOLERANCE[dtype] * 2


def test_cpu_flash_reports_keyless_rows_as_zero_and_is_normalised() -> None:
    block = random_block("cpu")
    rows, cols = block.shape
    q = torch.randn(rows, 2, 16)
    k, v = torch.randn(cols, 2, 16), torch.randn(cols, 2, 16)
    raw_out, raw_lse = CpuFlashKernel().forward(q, k, v, block, 0.25)
    keyless = ~block.row_has_key
    assert (raw_lse[:, keyless] == 0).all() and (raw_out[keyless] == 0).all()
    out, lse = block_forward(CpuFlashKernel(), q, k, v, block, 0.25)
    assert torch.isneginf(lse[:, keyless]).all() and (out[keyless] == 0).all()


def test_tiled_calls_equal_one_call_over_the_block() -> None:
    """Dense kernels run per non-empty tile; merging the tiles gives the untiled result."""
    torch.manual_seed(1)
    lengths = torch.tensor([100, 3, 250, 1, 180, 66])
    segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    index = torch.arange(int(lengths.sum()))
    block = block_mask(index, segment, index, segment)
    calls = kernel_calls((CpuFlashKernel(),), block)
    assert 1 < len(calls) < len(range(0, len(index), CpuFlashKernel.tile)) ** 2
    q, k, v = torch.randn(len(index), 4, 16), torch.randn(len(index), 2, 16), torch.randn(len(index), 2, 16)
    out = torch.zeros_like(q)
    lse = torch.full((4, len(index)), NEG_INF)
    for kernel, tile in calls:
        tile_out, tile_lse = block_forward(kernel, q[tile.rows], k[tile.cols], v[tile.cols], tile, 0.25)
        merge_into(out[tile.rows], lse[:, tile.rows], tile_out, tile_lse)
    ref_out, ref_lse = reference(q, k, v, block.allowed(), 0.25)
    assert relative_error(out, ref_out) <= 1e-5 and relative_error(lse, ref_lse) <= 1e-5


def test_kernel_selection() -> None:
    cpu = torch.device("cpu")
    assert [k.name for k in select_kernels(cpu, torch.bfloat16, 64, 8, 2)] == ["cpu_flash"]
    assert [k.name for k in select_kernels(cpu, torch.float32, 64, 8, 2, "math")] == ["math"]
    with pytest.raises(ValueError):
        select_kernels(cpu, torch.float32, 64, 8, 2, "flash_attn_varlen")
    with pytest.raises(ValueError):
        select_kernels(cpu, torch.float32, 64, 8, 2, "no_such_kernel")
    with pytest.raises(TypeError):
        select_kernels(cpu, torch.int64, 64, 8, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_selection_ends_with_math_and_prefers_varlen_for_half_precision() -> None:
    kernels = select_kernels(torch.device("cuda"), torch.bfloat16, 64, 8, 2)
    assert kernels[-1].name == "math"
    assert kernels[0].name in ("flash_attn_varlen", "torch_flash_varlen", "torch_efficient")
    assert isinstance(kernels[-1], MathKernel)


def test_cuda_module_is_import_safe_and_its_probe_judges_kernels() -> None:
    """The probe that admits CUDA kernels, run on CPU with the CPU kernel and a broken variant of it."""
    from longctx.trainer.attention import cuda_kernels

    cpu = torch.device("cpu")
    assert [block.varlen.causal for block in cuda_kernels._probe_blocks(cpu)] == [True, False]
    assert cuda_kernels._passes_probe(CpuFlashKernel(), cpu, torch.float32, 16, 4, 2)

    class ShiftedLse(CpuFlashKernel):
        name = "shifted_lse"

        def forward(self, q, k, v, block, scale):  # type: ignore[no-untyped-def]
            out, lse = super().forward(q, k, v, block, scale)
            return out, lse + 0.5

    assert not cuda_kernels._passes_probe(ShiftedLse(), cpu, torch.float32, 16, 4, 2)


def test_efficient_kernel_mask_is_aligned_and_broadcast_over_heads() -> None:
    from longctx.trainer.attention.cuda_kernels import TorchEfficientKernel

    block = random_block("cpu")
    bias = TorchEfficientKernel()._bias(block, torch.float32, 8)
    assert bias.shape == (1, 8, *block.shape) and bias.stride(1) == 0 and bias.stride(2) % 16 == 0
    assert torch.equal(bias[0, 3] == 0, block.allowed())


def _layouts(shape: tuple[int, int, int], dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """The same values as ``[tokens, heads, dim]`` views of differently laid-out memory."""
    base = torch.randn(*shape, device=device).to(dtype)
    strided = torch.zeros(*shape[:-1], 2 * shape[-1], device=device, dtype=dtype)
    strided[..., ::2] = base
    return {
        "contiguous": base,
        "every_other_dim": strided[..., ::2],  # stride 2 along head_dim
        "heads_major": base.transpose(0, 1).contiguous().transpose(0, 1),
        "dim_major": base.permute(2, 0, 1).contiguous().permute(1, 2, 0),  # stride != 1 along head_dim
    }


CUDA_BACKENDS = ["flash_attn_varlen", "torch_flash_varlen", "torch_efficient"]


@pytest.mark.parametrize("layout", ["every_other_dim", "heads_major", "dim_major"])
@pytest.mark.parametrize(
    ("device", "backend"),
    [("cpu", "cpu_flash"), ("cpu", "math")]
    + [
        pytest.param(
            "cuda", b, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
        )
        for b in [*CUDA_BACKENDS, "math"]
    ],
)
def test_every_kernel_is_exact_on_strided_and_transposed_inputs(
    device: str, backend: str, layout: str
) -> None:
    """Views whose head_dim is not contiguous once gave errors of about 2 with the CPU flash kernel."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(1)
    block = random_block(device)
    rows, cols = block.shape
    try:
        kernel = select_kernels(torch.device(device), dtype, 16, 8, 2, backend)[0]
    except RuntimeError as err:  # a CUDA kernel this GPU or install cannot run
        pytest.skip(str(err))
    q, k, v, dout, window_out = (
        _layouts(shape, dtype, device)[layout]
        for shape in ((rows, 8, 16), (cols, 2, 16), (cols, 2, 16), (rows, 8, 16), (rows, 8, 16))
    )
    assert q.stride(-1) != 1 or layout == "heads_major"
    out, lse = block_forward(kernel, q, k, v, block, 0.3)
    ref_out, ref_lse = reference(q, k, v, block.allowed(), 0.3)
    assert relative_error(out, ref_out) <= TOLERANCE[dtype]
    # backward against the same kernel on contiguous copies, which the reference test above checks
    window_lse = torch.where(torch.isinf(ref_lse), 1.0, ref_lse + 0.5).to(lse.dtype)
    strided = block_backward(kernel, dout, q, k, v, window_out, window_lse, block, 0.3)
    dense = block_backward(
        kernel, *(x.contiguous() for x in (dout, q, k, v, window_out)), window_lse, block, 0.3
    )
    assert all(torch.equal(a, b) for a, b in zip(strided, dense))


@pytest.mark.parametrize("layout", ["every_other_dim", "dim_major"])
def test_ring_attention_on_strided_inputs_matches_the_float64_reference(layout: str) -> None:
    """One rank (a local call) through the public entry point, forward and gradients."""
    from longctx.trainer.attention.plan import build_ring_plan

    torch.manual_seed(2)
    tokens, lengths = 48, [20, 28]
    segment = torch.repeat_interleave(torch.arange(2), torch.tensor(lengths))
    index = torch.arange(tokens)
    plan = build_ring_plan(index, segment, group=None)
    q, k, v = (_layouts((tokens, h, 16), torch.float64, "cpu")[layout].requires_grad_() for h in (4, 2, 2))
    out = ring_attention(q, k, v, plan)
    allowed = (index[:, None] >= index[None, :]) & (segment[:, None] == segment[None, :])
    ref_out, _ = reference(q, k, v, allowed, 16**-0.5)
    assert relative_error(out, ref_out) <= 1e-10
    weights = torch.randn_like(ref_out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref_out * weights).sum(), (q, k, v))
    for actual, expected in zip(grads, ref_grads):
        assert relative_error(actual, expected) <= 1e-10

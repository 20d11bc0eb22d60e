"""The GPU suite (gpu_suite.py) kept working without a GPU: its CPU smoke run, and the parts of it that
decide a result (the float64 reference, the comparison, the out-of-memory search, the wheel check).

The suite's own reference is checked against the project's float64 reference in
tests/trainer/test_ring_attention.py, and its comparison against deliberately wrong results, so that a
GPU run that reports "passed" means what it says.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import gpu_attention
import gpu_training
import gpu_wheels
from gpu_measure import Deadline
from packaging.utils import canonicalize_name

from tests.trainer.test_ring_attention import HEAD_DIM, LAYOUTS, SEQ_LEN, reference, window_inputs


@pytest.mark.slow
def test_cpu_smoke_runs_every_section(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_suite.py"), "--cpu-smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke" and report["passed"]
    assert "not GPU figures" in run.stdout
    sections = report["sections"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(
        ("exactness", "speed", "cp_modes", "training", "longest", "memory"), "passed"
    )
    exact = sections["exactness"]["summary"]
    # dtypes x kernels (auto, cpu_flash, math) x (layouts x ring modes + one strided layout)
    assert exact["checked"] == 2 * 3 * (4 * 2 + 1)
    ring_cases = [c for c in sections["exactness"]["cases"] if "layout" in c]
    assert all(c["passed"] for c in ring_cases)
    # the fused ops (PyTorch's here: liger-kernel needs CUDA, and says so) and a compiled layer
    kernel_checks = [c for c in sections["exactness"]["cases"] if "check" in c]
    assert {(c["check"], c.get("op"), c["status"]) for c in kernel_checks} >= {
        ("fused", None, "unavailable"),
        ("fused", "rms_norm", "ok"),
        ("fused", "swiglu", "ok"),
        ("fused", "rope", "ok"),
        ("fused", "linear_cross_entropy", "ok"),
        ("compiled layer", None, "ok"),
    }
    assert exact["fused_and_compiled_checked"] and not exact["failures"]
    probes = [c for c in sections["exactness"]["cases"] if "probe_shape" in c]
    assert len(probes) == 2 * 2 and {c["status"] for c in probes} == {"ok"}  # dtypes x head shapes, cpu_flash
    assert {tuple(sorted(c["kernels_used"])) for c in ring_cases} == {
        ("cpu_flash",),
        ("math",),
    }
    speed = sections["speed"]["summary"]
    assert [row["tokens"] for row in speed["rows"]] == [256, 512]
    assert speed["pinned_backends"] == ["cpu_flash", "math"] and "many_documents_goal_met" in speed
    assert set(speed["rows"][0]["pinned_forward_backward_tflops"]) == {"cpu_flash", "math"}
    training = sections["training"]["summary"]
    assert training["losses_finite"] and training["passed"]
    cases = {case["case"]: case for case in training["cases"]}
    assert list(cases) == ["1.1B auto", "1.1B full plain", "1.1B auto short", "1.1B auto long", "3B auto",
                           "1.1B auto compiled"]  # fmt: skip
    assert all(case["status"] == "measured" and case["tokens_per_s"] > 0 for case in cases.values())
    assert cases["1.1B full plain"]["checkpointing"] == "full"
    assert cases["1.1B auto"]["checkpointing"] == "none"  # a tiny model: everything fits
    assert "compiled blocks yes" in cases["1.1B auto compiled"]["kernels"]
    assert [cases[name]["seq_len"] for name in ("1.1B auto short", "1.1B auto", "1.1B auto long")] == [
        128,
        256,
        512,
    ]
    details = [c["summary"] for c in sections["training"]["cases"] if "summary" in c]
    profiled = [d for d in details if "profile" in d]
    assert [d["case"] for d in profiled] == ["1.1B auto"]
    shares = profiled[0]["profile"]["share"]
    import gpu_profile

    assert set(shares) == set(gpu_profile.CATEGORIES) and shares["unattributed"] == 0  # CPU: all attributed
    assert abs(sum(shares.values()) - 1) < 1e-6 and shares["attention"] > 0 and shares["matmuls"] > 0
    assert all(d["plan_estimate"]["total_gib"] > 0 for d in details)
    assert sections["longest"]["summary"]["fits"] == [256, 512, 1024]
    memory_cases = sections["memory"]["cases"]
    assert [(c["mode"], c["status"]) for c in memory_cases] == [
        ("selective", "measured"),
        ("none", "measured"),
    ]
    assert all(c["plan_estimate"]["total_gib"] > 0 and c["loss"] > 0 for c in memory_cases)
    # Everything the suite's code imports is on the GPU machine or travels as a wheel.
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    allowed = gpu_wheels.DEVICE_PACKAGES | {canonicalize_name(name) for name in gpu_wheels.WHEELS}
    for module in report["imports"]:
        dists = {canonicalize_name(d) for d in owners.get(module, [module])}
        assert dists & allowed, f"{module} ({dists}) is neither on the GPU machine nor carried as a wheel"


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2)])
def test_suite_reference_equals_the_project_reference(heads: int, kv_heads: int) -> None:
    for seed, lengths in enumerate(LAYOUTS.values()):
        inputs = window_inputs(seed, heads, kv_heads)
        expected = reference(inputs, lengths)
        actual = gpu_attention.reference_attention(*inputs, lengths, HEAD_DIM**-0.5)
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


def test_comparison_catches_wrong_results() -> None:
    lengths = LAYOUTS["many_short"]
    inputs = [x.to(torch.bfloat16) for x in window_inputs(0, 8, 2)]
    expected = gpu_attention.reference_attention(*inputs, lengths, HEAD_DIM**-0.5)
    device = torch.device("cpu")
    right, _ = gpu_attention.ring_single_rank(inputs, gpu_attention.segments_of(lengths), device, "auto")
    assert gpu_attention.compare(right, expected, torch.bfloat16)["passed"]
    # The same window attended as one document (the document mask lost) must fail.
    wrong, _ = gpu_attention.ring_single_rank(inputs, gpu_attention.segments_of([SEQ_LEN]), device, "auto")
    result = gpu_attention.compare(wrong, expected, torch.bfloat16)
    assert not result["passed"] and result["worst"] > 10 * result["tolerance"]
    # A NaN anywhere fails, whatever the other values.
    poisoned = [t.clone() for t in right]
    poisoned[2][5, 1, 3] = float("nan")
    assert not gpu_attention.compare(poisoned, expected, torch.bfloat16)["passed"]


def test_virtual_zigzag_ring_equals_the_reference_and_uses_off_diagonal_blocks() -> None:
    lengths = LAYOUTS["crossing_every_rank"]
    inputs = [x.to(torch.float32) for x in window_inputs(3, 8, 2)]
    expected = gpu_attention.reference_attention(*inputs, lengths, HEAD_DIM**-0.5)
    kernels = gpu_attention.select_kernels(torch.device("cpu"), torch.float32, HEAD_DIM, 8, 2, "math")
    actual, used = gpu_attention.ring_virtual_zigzag(
        inputs, gpu_attention.segments_of(lengths), torch.device("cpu"), kernels
    )
    assert gpu_attention.compare(actual, expected, torch.float32)["passed"]
    assert used["math"] > gpu_attention.VIRTUAL_WORLD  # more blocks than the diagonal ones


def test_exactness_layouts_cover_the_edge_cases() -> None:
    layouts = gpu_attention.exactness_layouts(3072)
    assert all(sum(lengths) == 3072 and min(lengths) >= 1 for lengths in layouts.values())
    assert layouts["one_document"] == [3072]
    assert layouts["length_one"].count(1) > 100 and "1, 1" in str(layouts["length_one"])
    assert len(layouts["many_short"]) > 20 and layouts["padding_tail"][-1] == 3072 // 6


def test_time_cap_skips_cases_and_fails_the_section() -> None:
    import gpu_suite

    settings = dataclasses.replace(gpu_suite.smoke_settings(10.0), exact_case_estimate_s=1.0)
    emitted: list[dict] = []
    summary = gpu_attention.run_exactness(settings, Deadline.after(-1.0), emitted.append)
    assert not summary["passed"] and summary["checked"] == 0
    ring_cases = [case for case in emitted if "probe_shape" not in case]  # probes take no time; they run
    assert ring_cases and all(case["status"] == "skipped" for case in ring_cases)


def test_longest_context_stops_at_the_first_out_of_memory() -> None:
    freed: list[int] = []
    emitted: list[dict] = []

    def try_length(length: int) -> dict:
        if length >= 512:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"seconds": 1.0}

    result = gpu_training.longest_context(
        [1024, 256, 512],
        try_length,
        lambda n: 0.0,
        Deadline.after(60),
        emitted.append,
        lambda: freed.append(1),
    )
    assert result["fits"] == [256] and result["longest_fitting"] == 256
    assert [c["status"] for c in emitted] == ["fits", "OOM", "not tried"]
    assert len(freed) == 4  # before and after each of the two tries

    def broken(length: int) -> dict:
        raise RuntimeError("index out of range")  # a bug, not an answer: it must not be swallowed

    with pytest.raises(RuntimeError, match="index out of range"):
        gpu_training.longest_context(
            [256], broken, lambda n: 0.0, Deadline.after(60), emitted.append, lambda: None
        )


def test_synthetic_rows_are_valid_packed_windows() -> None:
    row, lengths = gpu_training.synthetic_row(4096, 1000, 1024, seed=1)
    shard = gpu_training.training_shard(row)
    assert sum(lengths) == 4096 and max(lengths[:-1]) <= 1024
    starts = row.cu_seqlens[:-1]
    assert (row.position_ids[starts] == 0).all() and row.loss_mask[starts].sum() == 0
    assert row.loss_mask[row.cu_seqlens[-2] :].sum() == 0  # padding trains nothing
    assert torch.equal(shard.indices, torch.arange(4096))
    assert int(shard.segment_ids.max()) == len(lengths) - 1


def test_training_rows_are_the_many_document_layout() -> None:
    from layouts import document_lengths

    row, lengths = gpu_training.many_document_row(4096, 1000, 64, seed=2)
    assert sum(lengths) == 4096 and lengths[-1] == 4096 // 64  # then the padding segment
    assert lengths[:-1] == document_lengths(4096 - 64, 64, seed=2)
    assert len(lengths) > 40 and max(lengths[:-1]) <= 127
    assert (row.position_ids[row.cu_seqlens[:-1]] == 0).all() and row.loss_mask[-64:].sum() == 0


def test_training_step_is_the_trainers_step() -> None:
    """The suite's step measures what ``longctx train`` runs: built at world size 1 with activation
    checkpointing, its loss and updated weights equal the trainer's own ``_forward_backward`` followed by
    the trainer's clipping and AdamW step on the same row, from the same seeded weights; its memory
    estimate is the one ``longctx train`` checks."""
    from types import SimpleNamespace

    from longctx.trainer.coverage import CoverageTracker
    from longctx.trainer.planning.memory import rank_memory
    from longctx.trainer.train import _forward_backward

    dims = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    }
    seq_len, vocab = 256, 500
    suite, trainer = (gpu_training.build_trainer(dims, seq_len, vocab) for _ in range(2))
    assert suite.config.activation_checkpointing == "full" and not suite.bf16  # precision auto on CPU
    assert suite.state.world_size == 1 and "world size 1" in suite.kind
    for p, q in zip(suite.model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(p, q)
    shard = gpu_training.training_shard(gpu_training.synthetic_row(seq_len, vocab, 64, seed=3)[0])

    loss = gpu_training.train_step(suite, shard, seq_len)
    run = SimpleNamespace(
        model=trainer.model,
        loss_multiplier=trainer.loss_multiplier,
        seq_len=seq_len,
        tracker=CoverageTracker(seq_len // 4, seq_len, 1000),
    )
    stats = _forward_backward(run, [shard], trainer.state, False, position_losses=False)
    torch.nn.utils.clip_grad_norm_(list(trainer.model.parameters()), trainer.config.optim.grad_clip)
    trainer.optimizer.step()
    assert loss == pytest.approx(stats.loss, rel=1e-6)
    for p, q in zip(suite.model.parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        assert p.grad is None  # freed after the step, as the trainer does

    estimate = gpu_training.plan_estimate_gib(suite, seq_len)["total_gib"] * 2**30
    checked = rank_memory(
        suite.model.config.shape, seq_len, 1, activation_checkpointing="full", compute_bytes=4
    )
    assert estimate == pytest.approx(checked.total)
    assert checked.total < rank_memory(suite.model.config.shape, seq_len, 1, compute_bytes=4).total


# Wheels ----------------------------------------------------------------------------------------------------
def _wheel(folder: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        body = "".join(f"Requires-Dist: {r}\n" for r in requires)
        archive.writestr(
            f"{name}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{body}",
        )
    return path


def test_wheel_check_finds_missing_duplicate_and_foreign_wheels(tmp_path: Path) -> None:
    for name, version in gpu_wheels.WHEELS.items():
        _wheel(tmp_path, name, version, ["typing-extensions>=4.6", 'tomli; python_version < "3.11"'])
    _wheel(tmp_path, "longctx", "0.1.0", ["torch>=2.4", "datatrove>=0.10"])
    assert gpu_wheels.check(tmp_path) == []
    _wheel(tmp_path, "pydantic", "2.0.0", [])  # a second version
    _wheel(tmp_path, "extra", "1.0", ["email-validator>=2"])  # a need nobody meets
    _wheel(tmp_path, "native", "1.0", [], tag="cp311-cp311-manylinux_2_17_x86_64")  # wrong Python
    problems = "\n".join(gpu_wheels.check(tmp_path))
    assert "two versions of pydantic" in problems
    assert "email-validator" in problems
    assert "native-1.0-cp311" in problems


def test_strided_mode_catches_kernels_that_read_head_dim_as_contiguous(monkeypatch) -> None:
    lengths = LAYOUTS["many_short"]
    inputs = [x.to(torch.float32) for x in window_inputs(4, 8, 2)]
    expected = gpu_attention.reference_attention(*inputs, lengths, HEAD_DIM**-0.5)
    segments, cpu = gpu_attention.segments_of(lengths), torch.device("cpu")
    right, _ = gpu_attention.ring_single_rank(inputs, segments, cpu, "cpu_flash", strided=True)
    assert gpu_attention.compare(right, expected, torch.float32)["passed"]
    # Without the contiguity guard where tensors enter the kernels, the strided check must fail.
    from longctx.trainer.attention import kernels, ring

    monkeypatch.setattr(kernels, "unit_stride", lambda x: x)
    monkeypatch.setattr(ring, "unit_stride", lambda x: x)
    wrong, _ = gpu_attention.ring_single_rank(inputs, segments, cpu, "cpu_flash", strided=True)
    assert not gpu_attention.compare(wrong, expected, torch.float32)["passed"]

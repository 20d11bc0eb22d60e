"""What each context-parallel mode costs (``longctx.trainer.planning.cp_modes``) and which ``longctx plan``
recommends, against closed forms worked out by hand in each test (never by the module's helpers)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.trainer.planning import cp_modes, plan
from longctx.trainer.planning.cp_modes import ModeCost
from longctx.trainer.planning.report import human_seconds

# h=64, 4 query heads and 2 KV heads of 16 (q = 64, k = 32), 2 layers
TOY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}


def shape(**change: int) -> plan.ModelShape:
    return plan.ModelShape.from_hf({**TOY, **change}, "toy")


def by_mode(costs: list[ModeCost]) -> dict[str, ModeCost]:
    assert [c.mode for c in costs] == ["ring", "ulysses", "allgather", "hybrid"]
    return {c.mode: c for c in costs}


def test_bytes_per_step_of_each_mode_on_a_toy_shape() -> None:
    """1,024 tokens over 4 ranks (n = 256), all in one node, no checkpointing:

    * ring: 3 steps of a K/V block 2 x 256 x 32 elements, bf16 forward (32,768 B), and the block plus
      its fp32 dK/dV backward (2 + 4 bytes: 98,304 B);
    * allgather: 3 blocks gathered (bf16) and 3 reduce-scattered (bf16);
    * ulysses over 4: 2 KV heads copied to 4; each rank sends 3/4 of q (64) + k, v (4 heads x 16 each)
      + the output (64) per token, bf16, forward and again backward;
    * hybrid over 2 (the only degree): the all-to-all sends 1/2 of q + k, v (2 heads, no copies) + the
      output, both ways; then a ring of 2 ranks, 1 step, blocks of 512 tokens of 2 / 2 = 1 KV head.
    """
    costs = by_mode(cp_modes.mode_costs(shape(), 1024, 4, plan.RunSettings(cp=4)))
    assert costs["ring"].bytes_per_step == 3 * (2 * 256 * 32 * 2 + 2 * 256 * 32 * 6) == 393_216
    assert costs["allgather"].bytes_per_step == 2 * 3 * (2 * 256 * 32 * 2) == 196_608
    assert costs["ulysses"].bytes_per_step == 2 * (3 / 4) * 256 * (64 + 2 * 4 * 16 + 64) * 2 == 196_608
    a2a = 2 * (1 / 2) * 256 * (64 + 2 * 2 * 16 + 64) * 2
    ring = 1 * (2 * 512 * 16 * 2 + 2 * 512 * 16 * 6)
    assert costs["hybrid"].bytes_per_step == a2a + ring == 98_304 + 131_072
    assert (costs["ulysses"].ulysses, costs["ulysses"].ring) == (4, 1)
    assert (costs["hybrid"].ulysses, costs["hybrid"].ring) == (2, 2)
    assert (costs["ring"].ulysses, costs["allgather"].ulysses) == (1, 1)
    # extra memory, held by both layers without checkpointing: allgather the window's K and V; ulysses
    # the copied KV heads (2 n (4 - 2) 16) and a second attention output (n q); hybrid only the latter
    assert costs["ring"].extra_memory_bytes == 0
    assert costs["allgather"].extra_memory_bytes == 2 * (2 * 1024 * 32 * 2) == 262_144
    assert costs["ulysses"].extra_memory_bytes == 2 * 2 * (2 * 256 * 2 * 16 + 256 * 64) == 131_072
    assert costs["hybrid"].extra_memory_bytes == 2 * 2 * (256 * 64) == 65_536


def test_checkpointing_reruns_communication_and_frees_what_it_produced() -> None:
    """Full checkpointing reruns every mode's forward communication in backward (the ring's too);
    selective keeps the ring operator's output, so only the collectives outside it (allgather's gather,
    ulysses' all-to-alls) run again. Either way their products are held for one layer only."""
    block = 2 * 256 * 32 * 2  # one rank's K/V, bf16
    full = by_mode(
        cp_modes.mode_costs(shape(), 1024, 4, plan.RunSettings(cp=4, activation_checkpointing="full"))
    )
    assert full["ring"].bytes_per_step == 3 * (2 * block + 3 * block)
    assert full["allgather"].bytes_per_step == 3 * 3 * block
    assert full["ulysses"].bytes_per_step == 3 * (3 / 4) * 256 * 256 * 2
    assert full["allgather"].extra_memory_bytes == 2 * 1024 * 32 * 2
    assert full["ulysses"].extra_memory_bytes == 2 * (2 * 256 * 2 * 16 + 256 * 64)
    selective = by_mode(
        cp_modes.mode_costs(shape(), 1024, 4, plan.RunSettings(cp=4, activation_checkpointing="selective"))
    )
    assert selective["ring"].bytes_per_step == 3 * (block + 3 * block)
    assert selective["allgather"].bytes_per_step == 3 * 3 * block
    assert selective["allgather"].extra_memory_bytes == 2 * 1024 * 32 * 2
    # attention compute per rank: 2 L^2 q / cp forward (causal), 2.5x backward, once more under full
    forward = 2 * 1024**2 * 64 / 4 / 400e12
    assert selective["ring"].compute_s == pytest.approx(3.5 * forward)
    assert full["ulysses"].compute_s == pytest.approx(4.5 * forward)
    assert full["hybrid"].compute_s == pytest.approx(4.5 * forward)


def test_times_links_and_what_is_exposed() -> None:
    """The ring overlaps each step's transfer with that step's attention (2 n^2 q FLOPs forward, 2.5x
    backward): only the excess is exposed. The collectives are all exposed. A group of at most
    ``gpus_per_node`` ranks uses the node's link, a larger one the network's."""
    settings = plan.RunSettings(
        cp=4, link_bytes_per_s=1e9, node_link_bytes_per_s=4e9, achieved_flops=1e12, gpus_per_node=2
    )
    costs = by_mode(cp_modes.mode_costs(shape(), 1024, 4, settings))
    block, flops = 2 * 256 * 32 * 2, 2 * 256**2 * 64
    ring = costs["ring"]  # 4 ranks > 2 per node: the network
    assert ring.comm_s == pytest.approx(3 * 4 * block / 1e9)
    exposed = 3 * (max(0, block / 1e9 - flops / 1e12) + max(0, 3 * block / 1e9 - 2.5 * flops / 1e12))
    assert ring.exposed_s == pytest.approx(exposed) and exposed > 0 and not ring.hidden
    assert costs["allgather"].exposed_s == costs["allgather"].comm_s == pytest.approx(6 * block / 1e9)
    assert costs["ulysses"].exposed_s == pytest.approx(196_608 / 1e9)  # 4 ranks: the network
    # the hybrid's all-to-all pairs and its ring of 2 each fit a node (4 GB/s)
    hybrid = costs["hybrid"]
    ring_step = 2 * 512 * 16 * 2
    ring_flops = 2 * 512**2 * 32  # 2 of the 4 query heads over blocks of 512 tokens
    ring_exposed = max(0, ring_step / 4e9 - ring_flops / 1e12) + max(
        0, 3 * ring_step / 4e9 - 2.5 * ring_flops / 1e12
    )
    assert hybrid.comm_s == pytest.approx(98_304 / 4e9 + 4 * ring_step / 4e9)
    assert hybrid.exposed_s == pytest.approx(98_304 / 4e9 + ring_exposed)
    # plenty of compute: the ring hides, and nothing of it is exposed
    fast = by_mode(cp_modes.mode_costs(shape(), 1024, 4, plan.RunSettings(cp=4, achieved_flops=1e9)))
    assert fast["ring"].exposed_s == 0 and fast["ring"].hidden


def test_ring_rows_of_the_plan_keep_the_network_link() -> None:
    """Only the modes' table uses the node's link: ``ring_step`` and the plan's ring rows do not."""
    settings = plan.RunSettings(cp=4, link_bytes_per_s=1e9, node_link_bytes_per_s=4e9)
    row = plan.plan_length(shape(), 1024, settings)
    assert row.ring.forward_comm_s == 2 * 256 * 32 * 2 / 1e9
    ring = cp_modes.mode_costs(shape(), 1024, 4, settings)[0]
    assert ring.comm_s == pytest.approx(3 * 4 * 2 * 256 * 32 * 2 / 4e9)


@pytest.mark.parametrize(
    ("change", "cp", "refused", "reason"),
    [
        (
            {"num_attention_heads": 6, "hidden_size": 96},
            4,
            "ulysses",
            "6 query heads do not split over 4 ranks",
        ),
        ({}, 2, "hybrid", "no all-to-all degree between 1 and cp 2 divides it"),
        (
            {"num_attention_heads": 12, "num_key_value_heads": 3, "hidden_size": 192},
            4,
            "ulysses",
            "3 key/value heads neither split over 4 ranks nor divide 4",
        ),
        (
            {"num_attention_heads": 12, "num_key_value_heads": 3, "hidden_size": 192},
            4,
            "hybrid",
            "no degree among 2 splits the heads: 3 key/value heads neither split over 2 ranks",
        ),
        ({}, 1, "ulysses", "cp 1: one rank holds the window"),
        ({}, 1, "allgather", "cp 1: one rank holds the window"),
        ({}, 1, "hybrid", "cp 1: one rank holds the window"),
    ],
)
def test_refusals(change: dict, cp: int, refused: str, reason: str) -> None:
    costs = by_mode(cp_modes.mode_costs(shape(**change), 1024, cp, plan.RunSettings(cp=cp)))
    assert reason in (costs[refused].refused or "")
    assert costs[refused].bytes_per_step == 0 and not costs[refused].hidden
    assert costs["ring"].refused is None


def test_six_heads_still_run_a_hybrid_of_2_at_cp_4() -> None:
    costs = by_mode(
        cp_modes.mode_costs(shape(num_attention_heads=6, hidden_size=96), 1024, 4, plan.RunSettings())
    )
    assert costs["hybrid"].refused is None and costs["hybrid"].ulysses == 2


def test_one_rank_is_the_ring() -> None:
    best = cp_modes.recommend_mode(shape(), 1024, 1, plan.RunSettings())
    assert (best.mode, best.ulysses, best.bytes_per_step, best.hidden) == ("ring", 1, 0, True)


def test_the_ring_when_its_transfers_hide() -> None:
    """Llama-3-8B at 128K over 8 ranks of one node (450 GB/s, 400 TFLOP/s): n = 16,384 tokens, and a
    step's transfer hides from n >= k (2 + 4) F / (2 x 1/2 x 2.5 q B) = 533 tokens (backward)."""
    model = plan.load_model_shape("llama-3-8b")
    threshold = 1024 * 6 * 400e12 / (2.5 * 4096 * 450e9)
    assert threshold < 131_072 // 8
    best = cp_modes.recommend_mode(model, 131_072, 8, plan.RunSettings(cp=8))
    assert (best.mode, best.exposed_s, best.extra_memory_bytes) == ("ring", 0, 0)


def test_ulysses_when_the_ring_cannot_hide_within_a_node() -> None:
    """Llama-3-8B on 512-token windows over 8 ranks of one node (450 GB/s, 400 TFLOP/s): n = 64 tokens,
    far under the ring's 533-token threshold, and too few for the hybrid's ring to hide either. Exposed
    per layer:

    * ring: 7 x (4nk/B - 2n^2q/F, 12nk/B - 5n^2q/F, each if positive);
    * allgather: 8 x 7 n k / B;
    * ulysses: 8 x 7/8 x n (q + k) / B (8 KV heads over 8 ranks, no copies);
    * hybrid (u = 2 or 4, r = 8 / u): 8 (u - 1)/u n (q + k) / B, plus its ring's excess over compute
      (blocks of u n tokens, k / u key/value and q / u query widths).
    """
    model = plan.load_model_shape("llama-3-8b")
    n, q, k, B, F = 64, 4096, 1024, 450e9, 400e12
    ring = 7 * (max(0, 4 * n * k / B - 2 * n**2 * q / F) + max(0, 12 * n * k / B - 5 * n**2 * q / F))
    allgather = 8 * 7 * n * k / B
    ulysses = 8 * 7 / 8 * n * (q + k) / B

    def hybrid(u: int) -> float:
        r, block, kv, step_q = 8 // u, u * n, k // u, q // u
        excess = max(0, 4 * block * kv / B - 2 * block**2 * step_q / F)  # 2 (K, V) x b x kv x 2 bytes
        excess += max(0, 12 * block * kv / B - 5 * block**2 * step_q / F)
        return 8 * (u - 1) / u * n * (q + k) / B + (r - 1) * excess

    assert ulysses < min(ring, allgather, hybrid(2), hybrid(4))
    settings = plan.RunSettings(cp=8)
    costs = by_mode(cp_modes.mode_costs(model, 512, 8, settings))
    assert costs["ring"].exposed_s == pytest.approx(ring)
    assert costs["allgather"].exposed_s == pytest.approx(allgather)
    assert costs["ulysses"].exposed_s == pytest.approx(ulysses)
    assert costs["hybrid"].exposed_s == pytest.approx(min(hybrid(2), hybrid(4)))
    best = cp_modes.recommend_mode(model, 512, 8, settings)
    assert (best.mode, best.ulysses, best.train_ulysses) == ("ulysses", 8, None)


def test_allgather_for_a_gqa_model_whose_keys_are_small() -> None:
    """Llama-3-70B (64 query heads, 8 KV heads) on 256-token windows over 8 ranks of one node: the
    gathered K/V (8 x 7 n k bytes) are fewer than ulysses' q, k, v and output (8 x 7/8 n (q + k)
    bytes, q = 8k) and nothing hides."""
    model = plan.load_model_shape("llama-3-70b")
    n, k = 32, 1024
    costs = by_mode(cp_modes.mode_costs(model, 256, 8, plan.RunSettings(cp=8)))
    assert costs["allgather"].exposed_s == pytest.approx(8 * 7 * n * k / 450e9)
    assert costs["ulysses"].exposed_s == pytest.approx(8 * 7 / 8 * n * 9 * k / 450e9)
    assert cp_modes.recommend_mode(model, 256, 8, plan.RunSettings(cp=8)).mode == "allgather"


def test_hybrid_when_cp_spans_nodes() -> None:
    """Llama-3-8B at 128K over 32 ranks, 8 per node (450 GB/s inside, 50 GB/s across): n = 4,096 is
    under the ring's 4,800-token threshold at 50 GB/s, ulysses over 32 ranks (8 KV heads copied to 32)
    crosses nodes; the hybrid's all-to-all stays in a node and its ring, of 8 x n-token blocks for a
    share of the heads, hides."""
    model = plan.load_model_shape("llama-3-8b")
    n, q, k, node, net, F = 4096, 4096, 1024, 450e9, 50e9, 400e12
    ring = 31 * (max(0, 4 * n * k / net - 2 * n**2 * q / F) + max(0, 12 * n * k / net - 5 * n**2 * q / F))
    ulysses = 8 * 31 / 32 * n * (q + 32 * 128) / net

    def hybrid(u: int) -> float:
        r, block, kv, step_q = 32 // u, u * n, k // u, q // u
        excess = max(0, 4 * block * kv / net - 2 * block**2 * step_q / F)
        excess += max(0, 12 * block * kv / net - 5 * block**2 * step_q / F)
        return 8 * (u - 1) / u * n * (q + k) / node + (r - 1) * excess

    best_u = min((2, 4, 8), key=hybrid)
    assert hybrid(best_u) < min(ring, ulysses, 8 * 31 * n * k / net)
    costs = by_mode(cp_modes.mode_costs(model, 131_072, 32, plan.RunSettings(cp=32)))
    assert costs["ring"].exposed_s == pytest.approx(ring)
    assert costs["ulysses"].exposed_s == pytest.approx(ulysses)
    assert (costs["hybrid"].ulysses, costs["hybrid"].exposed_s) == (best_u, pytest.approx(hybrid(best_u)))
    best = cp_modes.recommend_mode(model, 131_072, 32, plan.RunSettings(cp=32))
    assert (best.mode, best.ulysses, best.ring, best.train_ulysses) == (
        "hybrid",
        best_u,
        32 // best_u,
        best_u,
    )


def test_hybrid_degrees_within_a_node_come_first() -> None:
    """At cp 32 with 4 GPUs per node the hybrid's all-to-all takes at most 4 ranks; with 1 per node no
    degree fits a node and every degree the mesh accepts is a candidate."""
    model = plan.load_model_shape("llama-3-8b")
    four = cp_modes.mode_costs(model, 131_072, 32, plan.RunSettings(cp=32, gpus_per_node=4))[3]
    assert four.ulysses in (2, 4)
    assert cp_modes.hybrid_degrees(32) == [2, 4, 8, 16]
    one = cp_modes.mode_costs(model, 131_072, 32, plan.RunSettings(cp=32, gpus_per_node=1))[3]
    assert one.refused is None and one.ulysses in (2, 4, 8, 16)


def cost(mode: str, exposed: float, memory: float = 0.0, ulysses: int = 1) -> ModeCost:
    return ModeCost(mode, ulysses, None, 1.0, exposed, exposed, exposed == 0, memory, 1.0)


def test_ties_go_to_the_ring() -> None:
    """Within 1% of the least exposed the ring wins; allgather never beats a ring that hides."""
    assert cp_modes.choose([cost("ring", 1.005), cost("ulysses", 1.0, 10.0, 8)]).mode == "ring"
    assert cp_modes.choose([cost("ring", 1.02), cost("ulysses", 1.0, 10.0, 8)]).mode == "ulysses"
    assert cp_modes.choose([cost("ring", 0.0), cost("allgather", 0.0, 5.0)]).mode == "ring"
    refused = ModeCost("ulysses", 1, "no", 0, 0, 0, False, 0, 0)
    assert cp_modes.choose([cost("ring", 3.0), refused, cost("allgather", 2.0, 5.0)]).mode == "allgather"
    # among the others, the least extra memory
    assert cp_modes.choose(
        [cost("ring", 9.0), cost("hybrid", 1.0, 4.0, 2), cost("ulysses", 1.0, 8.0, 8)]
    ).mode == ("hybrid")


def test_a_window_that_does_not_split_is_refused() -> None:
    with pytest.raises(plan.ConfigError, match="multiple of 2 x cp"):
        cp_modes.mode_costs(shape(), 1000, 16, plan.RunSettings(cp=16))


def test_cli_prints_the_modes_and_the_recommendation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plan.csv"
    argv = ["plan", "--model", "llama-3-8b", "--lengths", "128K,1M", "--cp", "32", "--csv", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert "context-parallel modes (train.cp_mode) over cp 32" in printed
    assert "groups of up to 8 ranks (one node) at 450 GB/s, larger ones at 50 GB/s" in printed
    header = next(i for i, line in enumerate(lines) if line.startswith("128K (checkpointing none)"))
    assert lines[header].split()[3:] == [
        "all-to-all", "ring", "sent", "communication", "exposed", "hidden", "attention", "extra", "memory"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == [
        "ring",
        "ulysses",
        "allgather",
        "hybrid",
    ]
    ring = lines[header + 1].split()
    assert ring[1:5] == ["1", "32", "1.9", "GiB"] and ring[9] == "NO"  # 31 x 16 n k = 1,984 MiB
    assert lines[header + 5].startswith("recommended cp_mode: hybrid (train.ulysses: 2): ")
    assert "against the ring's" in lines[header + 5]
    at_1m = next(
        line for line in lines if line.startswith("recommended cp_mode") and line != lines[header + 5]
    )
    hides = "its transfers hide behind attention compute, and it holds no extra memory"
    assert at_1m == f"recommended cp_mode: ring: {hides}"
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["cp_recommended"] for r in rows] == ["hybrid", "ring"]
    assert [r["cp_recommended_ulysses"] for r in rows] == ["2", ""]
    n, k = 4096, 1024
    assert float(rows[0]["cp_ring_bytes_per_step"]) == 31 * 16 * n * k
    assert float(rows[0]["cp_allgather_bytes_per_step"]) == 31 * 8 * n * k
    assert float(rows[0]["cp_allgather_extra_memory_bytes"]) == 32 * 4 * 131_072 * k
    assert rows[0]["cp_ulysses_ulysses"] == "32" and rows[0]["cp_ulysses_refused"] == ""
    assert float(rows[1]["cp_ring_exposed_s"]) == 0 and rows[1]["cp_ring_hidden"] == "1"


def test_cli_says_why_when_the_ring_is_exposed_but_least(capsys: pytest.CaptureFixture) -> None:
    """Llama-3-70B on 2K windows over 8 ranks of a node: n = 256 tokens, under the ring's backward
    threshold k 6 F / (2.5 q B) = 267 tokens, so the backward shows
    7 x (12 n k / B - 5 n^2 q / F); the others are whole collectives, larger."""
    assert main(["plan", "--model", "llama-3-70b", "--lengths", "2K", "--cp", "8"]) == 0
    n, q, k, B, F = 256, 8192, 1024, 450e9, 400e12
    exposed = 7 * (12 * n * k / B - 5 * n**2 * q / F)
    assert 0 < exposed < 8 * 7 * n * k / B
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("recommended")]
    least = f"the least exposed communication, {human_seconds(exposed)} per layer; next "
    assert line.startswith(f"recommended cp_mode: ring: {least}")


def test_cli_refusals_and_one_rank(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", "--model", "llama-3-8b", "--lengths", "8K", "--cp", "2"]) == 0
    printed = capsys.readouterr().out
    assert "hybrid" in printed and "refused: no all-to-all degree between 1 and cp 2 divides it" in printed
    assert main(["plan", "--model", "llama-3-8b", "--lengths", "8K"]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("cp 1, one rank holds each window: the ring's local call")


def test_cli_links_change_the_table_only(capsys: pytest.CaptureFixture) -> None:
    """``--gpus-per-node 32`` puts the whole ring in one node: it hides at 450 GB/s; the plan's own ring
    rows keep ``--link-gbytes-per-s``."""
    argv = ["plan", "--model", "llama-3-8b", "--lengths", "128K", "--cp", "32"]
    assert main(argv) == 0
    before = capsys.readouterr().out
    assert main([*argv, "--gpus-per-node", "32", "--node-link-gbytes-per-s", "450"]) == 0
    after = capsys.readouterr().out
    top = before.index("context-parallel modes")
    assert after[:top] == before[:top]
    assert "recommended cp_mode: ring: its transfers hide" in after


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--gpus-per-node", "0", "--gpus-per-node 0: must be at least 1"),
        ("--node-link-gbytes-per-s", "0", "--node-link-gbytes-per-s 0: must be a positive number of GB/s"),
        ("--node-link-gbytes-per-s", "-5", "--node-link-gbytes-per-s -5: must be a positive number"),
        ("--node-link-gbytes-per-s", "nan", "--node-link-gbytes-per-s nan: must be a positive number"),
        ("--node-link-gbytes-per-s", "inf", "--node-link-gbytes-per-s inf: must be a positive number"),
        ("--link-gbytes-per-s", "0", "--link-gbytes-per-s 0: must be a positive number"),
    ],
)
def test_bad_link_flags_are_one_line(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["plan", "--model", "llama-3-8b", "--lengths", "8K", "--cp", "8", flag, value]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_settings_are_refused() -> None:
    with pytest.raises(plan.ConfigError, match="GPUs per node"):
        plan.RunSettings(gpus_per_node=0)
    with pytest.raises(plan.ConfigError, match="node link bandwidth"):
        plan.RunSettings(node_link_bytes_per_s=math.nan)

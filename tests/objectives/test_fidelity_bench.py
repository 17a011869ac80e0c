"""Tests of bench/fidelity.py's scoring, its data files and its layer copying (no model is priced
at scale, nothing is timed): every expected number below is worked out by hand in the comments."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from objectives.calibration import StepRow, read_step_rows
from planner.calibrate import Priced

REPO = Path(__file__).resolve().parents[2]
_PATH = REPO / "bench" / "fidelity.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fidelity", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ranking_scores_by_hand(bench):
    jobs = {
        # predicted best = layout 2 (4.0), measured best = layout 3 (9.0): miss, regret 10/9 - 1.
        # pairs (1,2): pred +, meas + -> right; (1,3): pred +, meas + -> right; (2,3): pred -, meas + -> wrong.
        "a": [(5.0, 12.0), (4.0, 10.0), (4.5, 9.0)],
        # one layout unpriced: ranked over the other two; predicted best (1.0) is measured best: hit.
        "b": [(1.0, 3.0), (math.inf, 1.0), (2.0, 4.0)],
        # a single layout: no ranking.
        "c": [(1.0, 1.0)],
        # equal measured times: no pair; the pick is a measured best.
        "d": [(1.0, 2.0), (3.0, 2.0)],
    }
    s = bench.ranking_scores(jobs)
    assert s["jobs"] == 3  # a, b, d
    assert s["top1"] == pytest.approx(2 / 3)
    assert s["mean_regret_pct"] == pytest.approx((10 / 9 - 1) * 100 / 3)
    assert s["pairs"] == 4  # 3 in a, 1 in b, 0 in d
    assert s["pair_accuracy"] == pytest.approx(3 / 4)
    assert s["incomplete_jobs"] == 1


def test_ranking_scores_of_nothing(bench):
    s = bench.ranking_scores({"x": [(math.inf, 1.0), (math.inf, 2.0)]})
    assert s["jobs"] == 0 and math.isnan(s["top1"]) and s["incomplete_jobs"] == 1


def _row(id: str, *, devices: int, per_node: int = 8, step_s: float, memory: float | None = None, split="holdout",
         global_batch: int = 8, tp: int = 1, mode: str = "") -> StepRow:
    return StepRow(id=id, model={"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
                   device="a100-80gb", devices=devices, devices_per_node=per_node, tp=tp, dp=devices // tp,
                   micro_batch=1, global_batch=global_batch, step_s=step_s, memory_bytes=memory, split=split, mode=mode)


def test_report_scores_groups_memory_and_jobs_by_hand(bench):
    priced = [
        # one job on 16 GPUs (multi-node): tp=1 measured 2.0 predicted 3.0 (+50 %); tp=2 measured 1.0 predicted 1.5.
        Priced(row=_row("m1", devices=16, step_s=2.0), time_s=3.0, memory_bytes=1.0),
        Priced(row=_row("m2", devices=16, tp=2, step_s=1.0, memory=4e9), time_s=1.5, memory_bytes=5e9),
        # one node: -20 %; no memory figure.
        Priced(row=_row("n1", devices=8, step_s=1.0), time_s=0.8, memory_bytes=1.0),
        # one GPU, unpriced.
        Priced(row=_row("g1", devices=1, per_node=1, step_s=1.0, memory=2e9, mode="sdpa"), reason="no config"),
        # a fit row: never in the held-out score.
        Priced(row=_row("f1", devices=8, step_s=1.0, split="fit"), time_s=100.0, memory_bytes=1.0),
    ]
    result = bench.report(priced, split="holdout")
    assert [r["id"] for r in result["rows"]] == ["m1", "m2", "n1", "g1"]
    t = result["step_time"]
    # signed errors +50, +50, -20 (and one missing): median |err| 50, MAPE 40, bias (median signed) +50.
    assert (t["all"]["rows"], t["all"]["missing"]) == (3, 1)
    assert t["all"]["median_abs_pct"] == pytest.approx(50.0)
    assert t["all"]["mape_pct"] == pytest.approx(40.0)
    assert t["all"]["bias_pct"] == pytest.approx(50.0)
    assert t["one node"]["bias_pct"] == pytest.approx(-20.0)
    assert t["multi-node"]["rows"] == 2
    assert t["one GPU / sdpa"]["missing"] == 1
    # memory: m2 5e9 vs 4e9 -> +25 %; g1 unpriced.
    assert result["memory"]["all"]["rows"] == 1 and result["memory"]["all"]["missing"] == 1
    assert result["memory"]["all"]["median_abs_pct"] == pytest.approx(25.0)
    # the 16-GPU job: predicted best (m2, 1.5) is the measured best (1.0); its one pair is ordered right.
    ranking = result["ranking"]["multi-node"]
    assert (ranking["jobs"], ranking["top1"], ranking["mean_regret_pct"], ranking["pair_accuracy"]) == (1, 1.0, 0.0, 1.0)
    assert result["coverage"] == {"rows": 4, "priced": 3}
    assert [r["id"] for r in bench.report(priced, split="fit")["rows"]] == ["f1"]


def test_data_files_parse_and_follow_their_sources(bench):
    rows = bench.load_rows(sorted((REPO / "bench" / "fidelity").glob("runs_*.jsonl")))
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)) == 128 + 29 + 7  # + runs_h100_fp8_cp.jsonl + runs_fms_fsdp.jsonl
    for r in rows:
        assert r.tp * r.cp * r.pp * r.dp == r.devices, r.id
        assert r.global_batch % (r.micro_batch * r.dp) == 0, r.id
        assert r.step_s > 0 and r.source, r.id
    split = {(r.id.split("-")[0], r.split) for r in rows}
    # The documented split: Narayanan Table 1 and the H100 gpt2/bert/mlp rows fit; the rest held out.
    fit = sorted(r.id for r in rows if r.split == "fit")
    assert all(i.startswith(("narayanan21-t1-", "h100-gpt2-", "h100-bert-", "h100-mlp-", "llmfoundry-h100-mpt1b-",
                             "llmfoundry-h100-mpt13b-", "torchtitan-llama3.1-8b-t1-")) for i in fit)
    assert len(fit) == 32 + 19 + 2 and ("korthikanti22", "fit") not in split
    by_id = {r.id: r for r in rows}
    # Narayanan Table 1, 1T: F = 96 B s l h^2 (1 + s/6h + V/16lh) with B 3072, s 2048, l 128, h 25600, V 51200,
    # at 163 TFLOP/s on each of 3072 GPUs.
    f = 96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    assert by_id["narayanan21-t1-1008.0b"].step_s == pytest.approx(f / (3072 * 163e12))
    # Korthikanti Table 5: iteration times as printed.
    assert by_id["korthikanti22-175b-full-recompute"].step_s == 18.13
    assert by_id["korthikanti22-175b-selective-sp"].step_s == 13.75
    assert by_id["h100-gpt2-b8-eager"].memory_bytes == 19297189376
    # Megatron-Core's Mixtral 8x7B at 468 TFLOP/s on 64 H100s, its own count (no recomputation):
    # F = 12 B s l h^2 [(1 + g/a + s/h) + (f/h) k 3/2 + V/(2 l h)], B 256, s 4096, l 32, h 4096, g/a 8/32,
    # f 14336, k 2, V 32000: 8.6956e16 FLOPs, 2.903 s
    f = 12 * 256 * 4096 * 32 * 4096**2 * ((1 + 8 / 32 + 1) + 14336 / 4096 * 2 * 1.5 + 32000 / (2 * 32 * 4096))
    assert by_id["mcore-moe-mixtral8x7b-g64-v0.9"].step_s == pytest.approx(f / (64 * 468e12))
    assert by_id["mcore-moe-mixtral8x7b-g64-v0.9"].ep == 8
    # fms-fsdp's 7B on 128 A100s (the PyTorch blog's Table 1): 3,700 tokens/s per GPU, 2 x 4,096 tokens per GPU
    # and step, so one step is 8,192 / 3,700 s; HSDP shards within a node of 8.
    fms = by_id["fmsfsdp-llama2-7b-a100-g128-hsdp8"]
    assert fms.step_s == pytest.approx(2 * 4096 / 3700) and fms.hsdp == 8 and fms.split == "holdout"


def test_h100_rows_equal_the_shared_calibration_file():
    shared = Path("/work/shared/calibration/h100_steps_examples.jsonl")
    if not shared.exists():
        pytest.skip("the shared calibration folder is not on this machine")
    ours = read_step_rows(REPO / "bench" / "fidelity" / "runs_h100.jsonl")
    theirs = read_step_rows(shared, device="h100-sxm")
    assert [(r.micro_batch, r.mode, r.step_s, r.memory_bytes) for r in ours] == \
        [(r.micro_batch, r.mode, r.step_s, r.memory_bytes) for r in theirs]


def test_layer_copies_make_a_deeper_gpt(bench, tmp_path):
    """gpt2_tiny (2 layers, hidden 64, vocab 1000, 128 positions) copied to 5 layers: 3 more layers of
    49 nodes, 5 layers found by the planner, and the parameters of GPT2LMHeadModel's formula
    (vocab + positions) h + L (12 h^2 + 13 h) + 2 h = 1128 * 64 + 5 * 49,984 + 128 = 322,240."""
    import onnx

    from objectives.cluster import make_cluster
    from planner.pipeline import PipelineCostCache, graph_loader

    model = onnx.load(str(REPO / "tests" / "data" / "gpt2_tiny.onnx"), load_external_data=False)
    before = len(model.graph.node)
    bench.replicate_layers(model, 5)
    assert len(model.graph.node) == before + 3 * 49
    onnx.checker.check_model(model)
    params = [t for t in model.graph.initializer if t.name.startswith(("transformer.", "lm_head."))]
    assert sum(int(np.prod(t.dims)) for t in params) == 322240
    path = tmp_path / "tiny5.onnx"
    onnx.save_model(model, str(path))
    cache = PipelineCostCache(graph_loader(path, {"seq": 16}), cluster=make_cluster("h100-sxm", devices=1))
    assert cache.structure(2).num_layers == 5
    with pytest.raises(ValueError, match="more than"):
        bench.replicate_layers(model, 3)


def test_calibration_file_applies_every_fitted_constant(bench, tmp_path):
    """A `planner calibrate` file's fitted device and link constants reach the rows' clusters, also
    those the cluster loader does not read itself."""
    import dataclasses

    import yaml

    from objectives.calibration import calibratable_parameters, cluster_file_dict, parameter_values, with_parameters
    from objectives.cluster import get_device, make_cluster

    base = make_cluster("a100-80gb", devices=16)
    params = calibratable_parameters(base)
    values = [1e-6 * (k + 1) if not p.reciprocal else 0.5 for k, p in enumerate(params)]
    path = tmp_path / "fitted.yaml"
    path.write_text(yaml.safe_dump(cluster_file_dict(with_parameters(base, params, values), preset=get_device("a100-80gb"))))
    loaded = bench._load_calibration(path)
    assert parameter_values(loaded, params).tolist() == pytest.approx(values)
    row = dataclasses.replace(_row("r", devices=8, step_s=1.0))
    chosen, applied = bench._constants_for(row, loaded)
    # an 8-GPU A100 row shares the device and both link presets: every constant applies
    assert [p.name for p in chosen] == [p.name for p in params] and list(applied) == pytest.approx(values)


def test_flop_baseline_by_hand(bench):
    """One utilisation from the fit rows, scored on the others. Parameters by equation (2) with
    l=2, h=1024, V=1000, s=1024: 12*2*1024^2 (1 + 13/12288 + 2024/24576) = 27,265,024."""
    m = {"kind": "gpt", "layers": 2, "hidden": 1024, "heads": 8, "seq": 1024, "vocab": 1000}
    params = 12 * 2 * 1024**2 * (1 + 13 / 12288 + 2024 / 24576)
    assert params == pytest.approx(27_265_024)
    fit = [StepRow(id="f", model=m, device="a100-80gb", devices=8, devices_per_node=8, dp=8, micro_batch=1,
                   global_batch=8, recompute="full", step_s=0.5)]
    held = [StepRow(id="h", model=m, device="a100-80gb", devices=16, devices_per_node=8, dp=16, micro_batch=1,
                    global_batch=32, step_s=0.9)]
    out = bench.flop_baseline(fit, held)
    # fit: 8 * P * 8 * 1024 FLOPs / (8 GPUs * 312e12) / 0.5 s; held: 6 * P * 32 * 1024 / (16 * 312e12) / u
    u = 8 * params * 8 * 1024 / (8 * 312e12) / 0.5
    predicted = 6 * params * 32 * 1024 / (16 * 312e12) / u
    assert out["utilisation"] == pytest.approx(u)
    assert out["multi-node"]["bias_pct"] == pytest.approx((predicted / 0.9 - 1) * 100)


def test_h100_cluster_rows_load_and_convert_by_hand(bench):
    """runs_h100_cluster.jsonl: 52 llm-foundry MPT rows (H100 80GB BF16 table) and 4 torchtitan Llama 3.1
    8B rows (Tables 1 and 3, BF16), each with its source, converted from the printed throughput."""
    rows = bench.load_rows([REPO / "bench" / "fidelity" / "runs_h100_cluster.jsonl"])
    assert len(rows) == 56
    assert sum(r.id.startswith("llmfoundry-") for r in rows) == 52
    assert sum(r.id.startswith("torchtitan-") for r in rows) == 4
    for r in rows:
        assert r.device == ("h100-sxm-96gb-500w" if r.id.startswith("torchtitan-") else "h100-sxm") and r.tp * r.pp * r.dp == r.devices and r.zero == 3, r.id
        assert r.global_batch % (r.micro_batch * r.dp) == 0 and r.source, r.id
        assert any(a.startswith("step_s = ") for a in r.assumed), r.id
    by_id = {r.id: r for r in rows}
    # llm-foundry README, H100 80GB BF16, 70b / SeqLen 2048 / 64 GPUs: GlobalBatchSize 2048, Throughput 66523 T/s.
    mpt70 = by_id["llmfoundry-h100-mpt70b-s2048-g64"]
    assert mpt70.step_s == pytest.approx(2048 * 2048 / 66523)  # 63.05 s
    assert (mpt70.micro_batch, mpt70.recompute, mpt70.split) == (8, "full", "holdout")
    # torchtitan docs/performance.md Table 1, FSDP: 5,762 TPS/GPU on 8 GPUs, global batch 16, seq 8192; 82.4 GiB.
    tt = by_id["torchtitan-llama3.1-8b-t1-g8-fsdp"]
    assert tt.step_s == pytest.approx(16 * 8192 / (5762 * 8))  # 2.843 s
    assert tt.memory_bytes == pytest.approx(82.4 * 2**30) and tt.device_memory_bytes == 96e9
    assert tt.model["kind"] == "llama" and tt.split == "fit"
    assert by_id["torchtitan-llama3.1-8b-t3-g128-fsdp-compile"].step_s == pytest.approx(256 * 8192 / (6514 * 128))
    # every row's files: a llama spec gets its own cached file name
    assert bench.gpt_file(tt.model).name == "llama_l32_h4096_a32_kv8_f14336_v128256_p8192.onnx"


def test_fp8_and_context_parallel_rows_load_and_convert_by_hand(bench):
    """runs_h100_fp8_cp.jsonl: 29 held-out H100 rows that train FP8 or use context parallelism (torchtitan
    Float8, async TP, Llama 3.1 405B on pp 8, with dp x cp x tp all above 1 since 2026-12-02; NeMo 24.07 FP8 with
    Nemotron; Megatron-Bridge 25.09), converted from the printed TPS/GPU; the row still not priceable stays in
    pending_h100.jsonl with why, and no row is in both."""
    rows = bench.load_rows([REPO / "bench" / "fidelity" / "runs_h100_fp8_cp.jsonl"])
    assert len(rows) == 29 and all(r.split == "holdout" for r in rows)
    assert sum(r.cp > 1 for r in rows) == 9 and sum(r.fp8 is not None for r in rows) == 29
    for r in rows:
        assert r.tp * r.cp * r.pp * r.dp == r.devices and r.global_batch % (r.micro_batch * r.dp) == 0, r.id
        assert any(a.startswith("step_s = ") for a in r.assumed) and any(r.precision in a for a in r.assumed), r.id
    by_id = {r.id: r for r in rows}
    # torchtitan Table 2, FSDP 2 x CP 4: 1,071 TPS/GPU on 8 GPUs, local batch 1, sequence 131,072
    tt = by_id["torchtitan-llama3.1-8b-t2-g8-fsdp2-cp4-float8"]
    assert tt.step_s == pytest.approx(2 * 131072 / (1071 * 8))  # 30.6 s
    assert (tt.dp, tt.cp, tt.zero, tt.precision, tt.fp8) == (2, 4, 3, "torchao-tensorwise", "rowwise")
    assert tt.memory_bytes == pytest.approx(84.0 * 2**30)
    # NeMo 24.07 LLAMA3-70B on 64 GPUs: TP 4, PP 4, CP 2, VP 5, GBS 128, 1,533 tokens/s/GPU at 8,192
    nemo = by_id["nemo2407-h100-llama3-70b-g64-cp2-fp8"]
    assert nemo.step_s == pytest.approx(128 * 8192 / (1533 * 64))  # 10.69 s
    assert (nemo.dp, nemo.schedule, nemo.chunks, nemo.fp8) == (2, "interleaved", 5, "delayed")
    # NeMo's GPTConfig5B keeps Megatron-Core's dropouts (0.1); its Llama recipes set them to 0.0 (issue 23, h30c)
    assert by_id["nemo2407-h100-gpt3-5b-g64-fp8"].dropout
    assert not any(by_id[i].dropout for i in ("nemo2407-h100-llama2-7b-g8-fp8", "nemo2407-h100-llama3-8b-g8-cp2-fp8"))
    # NeMo 24.07 Nemotron-8B on 64 GPUs: TP 2, GBS 256, 12,701 tokens/s/GPU at 4,096; NeMo's Nemotron3Config8B
    nemotron = by_id["nemo2407-h100-nemotron-8b-g64-fp8"]
    assert nemotron.step_s == pytest.approx(256 * 4096 / (12701 * 64))  # 1.290 s
    assert (nemotron.dp, nemotron.tp_comm_overlap, nemotron.fp8, nemotron.model["kind"]) == (32, True, "delayed", "nemotron")
    assert bench.gpt_file(nemotron.model).name == "nemotron_l32_h4096_a32_kv32_f16384_v256000_p4096.onnx"
    # torchtitan Table 6, FSDP 1 x CP 8 x TP 8 x PP 8 at 262,144 tokens: 16 TPS/GPU, local batch 8 per FSDP rank.
    # Its default split (no split points): 126 // 8 = 15 layers, the middle stages one more while 126 % 8 = 6
    # lasts, the last the rest: 15, 16 x 6, 15; its default 8 micro-batches of the local 8: micro-batch 1.
    t6 = by_id["torchtitan-t6-405b-g512-fsdp1-cp8"]
    assert t6.step_s == pytest.approx(1 * 8 * 262144 / (16 * 512))  # 256 s
    assert (t6.dp, t6.cp, t6.micro_batch, t6.schedule, t6.tp_comm_overlap) == (1, 8, 1, "1f1b", True)
    assert t6.stage_layers == (15, 16, 16, 16, 16, 16, 16, 15) and sum(t6.stage_layers) == 126
    # Table 5 interleaved: 16 stages of 126 // 16 = 7, the middle 14 one more; rank r holds stages r and r + 8.
    per_stage = [7] + [8] * 14 + [7]
    t5 = by_id["torchtitan-t5-405b-g512-interleaved-1f1b"]
    assert t5.stage_layers == tuple(per_stage[r] + per_stage[r + 8] for r in range(8)) and t5.chunks == 2
    assert t5.micro_batch == 32 // 16 and t5.global_batch == 32 * 8
    pending = [json.loads(line) for line in (REPO / "bench" / "fidelity" / "pending_h100.jsonl").read_text().splitlines()]
    assert len(pending) == 1 and all(p["why_not"] for p in pending)
    assert not {p["id"] for p in pending} & set(by_id)
    # Megatron-Bridge 25.09 Llama 3.1 405B (dp 8 x cp 2 x tp 8): embedding and loss counted as layers,
    # 128 / (8 x 8) = 2 per chunk, so the first and last ranks hold 8 x 2 - 1 = 15 layers.
    bridge = by_id["megatronbridge2509-h100-llama3.1_405b-g1024"]
    assert (bridge.dp, bridge.cp, bridge.tp, bridge.pp) == (1024 // (2 * 8 * 8), 2, 8, 8)
    assert bridge.stage_layers == (8 * 2 - 1,) + (16,) * 6 + (8 * 2 - 1,) and bridge.chunks == 8
    assert bridge.step_s == pytest.approx(512 * 8192 / (302 * 1024))  # 13.56 s
    # torchtitan Table 6, FSDP 4 x CP 2 at 65,536 tokens: 47 TPS/GPU, local batch 8 per FSDP rank
    t6_cp2 = by_id["torchtitan-t6-405b-g512-fsdp4-cp2"]
    assert (t6_cp2.dp, t6_cp2.cp, t6_cp2.tp, t6_cp2.global_batch) == (4, 2, 8, 4 * 8)
    assert t6_cp2.step_s == pytest.approx(4 * 8 * 65536 / (47 * 512))  # 87.1 s


def test_nemo_gpt3_rows_follow_their_launcher_confs(bench):
    """Issue 23 audit (2026-12-02, h30h): the NeMo 24.07 GPT-3 FP8 rows carry what NeMo-Framework-Launcher's
    Transformer Engine confs set (gpt3/5b.yaml, 20b.yaml, 175b.yaml at commit 056a90ed; 5b_ and 175b_fp8_performance.yaml):
    activations_checkpoint_granularity: selective, hidden_dropout 0.1 (attention_dropout left at 0.1); the table's
    own columns where it prints them (175B: VP 6 where the conf and its run script say 12; 20B: TP 2, MBS 2 where the
    conf says 4 and 4)."""
    rows = bench.load_rows([REPO / "bench" / "fidelity" / "runs_h100_fp8_cp.jsonl"])
    by_id = {r.id: r for r in rows}
    gpt3 = {i: by_id[f"nemo2407-h100-gpt3-{i}-fp8"] for i in ("5b-g64", "20b-g64", "175b-g128", "175b-g512")}
    assert {i: (r.recompute, r.dropout) for i, r in gpt3.items()} == {i: ("selective", True) for i in gpt3}
    assert [(gpt3[i].chunks, gpt3[i].pp, gpt3[i].tp) for i in ("175b-g128", "175b-g512")] == [(6, 8, 4)] * 2
    assert (gpt3["20b-g64"].tp, gpt3["20b-g64"].micro_batch) == (2, 2)
    assert all(any(a.startswith("recompute selective (issue 23 audit") for a in r.assumed) for r in gpt3.values())
    # the Llama / Nemotron confs set activations_checkpoint_granularity null and their dropouts 0.0: unchanged
    others = [r for r in rows if r.id.startswith("nemo2407-") and "gpt3" not in r.id]
    assert len(others) == 8 and all((r.recompute, r.dropout) == ("none", False) for r in others)

def test_regime_scores_and_false_does_not_fit_by_hand(bench):
    """Per-regime and per-style error and the false 'does not fit' count (the predicted live tensors
    over the GPU) and the tight rows (over it only with the allocator's reserve), against each row's
    own GPU memory (the source's where it states one, else the preset's: H100 SXM, 85,017,755,648 B exposed
    to CUDA less the 666,632,192 B CUDA context = 84,351,123,456 B)."""
    import dataclasses

    def h100(id, devices, step_s, *, zero=3, tp=1, memory=None):
        r = _row(id, devices=devices, step_s=step_s, tp=tp)
        return dataclasses.replace(r, device="h100-sxm", zero=zero, device_memory_bytes=memory)

    priced = [
        # one node, FSDP: +10 % and -30 %: median |err| 20, bias -10; 84.5 GB of live tensors (93 GB with the
        # allocator's reserve) predicted on the 84.35 GB preset: false no-fit.
        Priced(row=h100("a", 8, 1.0), time_s=1.1, memory_bytes=93e9, allocated_bytes=84.5e9),
        Priced(row=h100("b", 8, 2.0), time_s=1.4, memory_bytes=10e9, allocated_bytes=9e9),
        # 9-64 GPUs, FSDP: +50 % twice; 85 GB on the source's 96 GB GPU fits; 84.2 GB live (92.6 GB with the
        # reserve) on the 84.35 GB preset is tight, not "does not fit" (under the old 80e9 B preset it was).
        Priced(row=h100("c", 16, 1.0, memory=96e9), time_s=1.5, memory_bytes=85e9, allocated_bytes=77e9),
        Priced(row=h100("g", 16, 1.0), time_s=1.5, memory_bytes=92.6e9, allocated_bytes=84.2e9),
        # 65-512 GPUs, Megatron tp 8: -20 %.
        Priced(row=h100("d", 128, 1.0, zero=1, tp=8), time_s=0.8, memory_bytes=1e9, allocated_bytes=1e9),
        # an A100 row in the same regime is scored apart.
        Priced(row=_row("e", devices=128, step_s=1.0), time_s=2.0, memory_bytes=1e9, allocated_bytes=1e9),
    ]
    out = bench.regime_scores(priced)
    reg, sty = out["regime"], out["style"]
    assert set(reg) == {"H100 | one node", "H100 | 9-64 GPUs", "H100 | 65-512 GPUs", "A100 | 65-512 GPUs"}
    assert reg["H100 | one node"]["median_abs_pct"] == pytest.approx(20.0)
    assert reg["H100 | one node"]["bias_pct"] == pytest.approx(-10.0)
    assert reg["H100 | one node"]["false_does_not_fit"] == 1
    assert reg["H100 | 9-64 GPUs"]["false_does_not_fit"] == 0
    assert reg["H100 | 65-512 GPUs"]["bias_pct"] == pytest.approx(-20.0)
    assert sty["H100 | FSDP"]["rows"] == 4 and sty["H100 | Megatron TP/PP"]["rows"] == 1
    assert sty["A100 | DDP"]["bias_pct"] == pytest.approx(100.0)
    result = bench.report(priced, split="holdout")
    assert result["false_does_not_fit"]["ids"] == ["a"] and result["regimes"] == out
    assert result["tight"]["ids"] == ["g"]


def test_host_grid_text_becomes_the_fit_host_grid(bench):
    # --host-grid 'layer_host_s=0,1e-3;microbatch_host_s=2e-3': two layer values, one micro-batch value, in seconds
    assert bench.parse_host_grid("layer_host_s=0,1e-3; microbatch_host_s=2e-3") == {
        "layer_host_s": (0.0, 1e-3), "microbatch_host_s": (2e-3,)}
    for bad in ("host_dispatch_s=3e-5", "layer_host_s=", "layer_host_s=1ms"):  # no such grid field, no value, not seconds
        with pytest.raises(SystemExit, match="--host-grid"):
            bench.parse_host_grid(bad)


def test_dims_2026_and_scale_trend_by_hand(bench):
    """Issue 24's dims per row and their scores, and issue 23's H100 multi-node trend (the least-squares slope
    of the signed error on log2(GPUs)), each against numbers worked out here."""
    import dataclasses

    def h100(id, devices, step_s, *, memory=None, **fields):
        r = _row(id, devices=devices, step_s=step_s, memory=memory)
        return dataclasses.replace(r, device="h100-sxm", zero=3, **fields)

    priced = [
        # cp 2 and FP8 under torchtitan (FSDP2): +10 %, memory 44 GB predicted against 40 GB measured (+10 %).
        Priced(row=h100("a", 16, 1.0, memory=40e9, cp=2, precision="torchao-tensorwise", source="torchtitan, docs"),
               time_s=1.1, memory_bytes=44e9, allocated_bytes=40e9),
        # HSDP 8 (FSDP1, fms-fsdp): -20 %, no memory figure.
        Priced(row=h100("b", 64, 1.0, hsdp=8, source="fms-fsdp"), time_s=0.8, memory_bytes=1e9, allocated_bytes=1e9),
        # plain FSDP1 on 256 GPUs: +30 %; in no dim.
        Priced(row=h100("c", 256, 1.0, source="llm-foundry"), time_s=1.3, memory_bytes=1e9, allocated_bytes=1e9),
        # one node and an A100 row: outside the trend.
        Priced(row=h100("d", 8, 1.0, source="llm-foundry"), time_s=2.0, memory_bytes=1e9, allocated_bytes=1e9),
        Priced(row=_row("e", devices=512, step_s=1.0), time_s=9.0, memory_bytes=1e9, allocated_bytes=1e9),
    ]
    assert [bench.dims_2026(p.row) for p in priced] == [("CP", "FP8", "FSDP2"), ("HSDP",), (), (), ()]
    dims = bench.dims_scores(priced)
    assert dims["CP"]["step_time"]["rows"] == 1 and dims["CP"]["step_time"]["median_abs_pct"] == pytest.approx(10.0)
    assert dims["CP"]["memory"]["rows"] == 1 and dims["CP"]["memory"]["median_abs_pct"] == pytest.approx(10.0)
    assert dims["HSDP"]["memory"]["rows"] == 0
    # any: +10 % and -20 %: median |err| 15, bias (median signed) -5
    assert dims["any"]["step_time"]["rows"] == 2
    assert dims["any"]["step_time"]["median_abs_pct"] == pytest.approx(15.0)
    assert dims["any"]["step_time"]["bias_pct"] == pytest.approx(-5.0)
    # trend over a (16 GPUs, +10), b (64, -20), c (256, +30): x = 4, 6, 8 (mean 6), y mean +20/3;
    # slope = sum((x - 6)(y - ybar)) / sum((x - 6)^2) = (-2 * 10 + 0 + 2 * 30) / 8 = 5 points per doubling (ybar
    # cancels: sum(x - 6) = 0)
    trend = bench.scale_trend(priced)
    assert trend["rows"] == 3 and trend["devices"] == [16, 256]
    assert trend["slope_pct_per_doubling"] == pytest.approx(5.0)
    result = bench.report(priced, split="holdout")
    assert result["dims_2026"] == dims and result["scale_trend"] == trend

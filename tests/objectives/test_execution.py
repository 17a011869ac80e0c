"""Execution models: defaults per target, overrides, settings, and what each model prices, by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from objectives.attention import find_attention_cores
from objectives.cluster import make_cluster
from objectives.execution import (
    FLASH_BACKWARD_EFFICIENCY,
    FLASH_BACKWARD_FLOPS_FACTOR,
    FLASH_BACKWARD_KERNELS,
    FLASH_EFFICIENCY,
    LSE_BYTES,
    ExecutionModel,
    default_execution,
    execution_of,
)
from objectives.memory import saved_activation_bytes
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like


class TestDefaults:
    """A launcher's default is data on its launch target (``Target.execution``); the roof hands it
    to :func:`default_execution`."""

    @staticmethod
    def _of(target, **options):
        from exporters.targets import TARGETS

        return default_execution(TARGETS[target].execution, **options)

    def test_megatron_runs_te_cudnn_attention_and_deepspeed_flash(self):
        # TransformerEngine prefers cuDNN's FusedAttention on Hopper+; Megatron-DeepSpeed calls flash-attn
        assert self._of("megatron") == ExecutionModel(engine="fused", attention="cudnn")
        assert self._of("deepspeed") == ExecutionModel(engine="fused", attention="flash")

    def test_dtensor_is_eager_pytorch_with_sdpa(self):
        assert self._of("dtensor") == ExecutionModel(engine="eager", attention="flash")

    def test_meshtf_is_xla_fused_with_explicit_scores(self):
        assert self._of("meshtf") == ExecutionModel(engine="fused", attention="explicit")

    def test_generic_is_priced_fused_and_flash_and_the_roofline_only_when_asked(self):
        assert self._of("generic") == ExecutionModel(engine="fused", attention="flash")
        assert default_execution() == ExecutionModel(engine="fused", attention="flash")
        assert self._of("generic", attention="explicit") == ExecutionModel(engine="fused", attention="explicit")
        assert self._of("generic", engine="roofline") is None
        assert self._of("megatron", engine="roofline") is None
        with pytest.raises(InputError, match="--attention"):
            self._of("generic", engine="roofline", attention="flash")

    def test_options_override_the_target(self):
        assert self._of("megatron", engine="eager") == ExecutionModel(engine="eager", attention="cudnn")
        assert self._of("megatron", attention="flash").attention == "flash"
        assert self._of("megatron", attention="explicit").attention == "explicit"
        assert default_execution(ExecutionModel(engine="eager"), attention="explicit") == ExecutionModel(
            engine="eager", attention="explicit"
        )

    def test_every_target_has_a_default(self):
        from exporters.targets import TARGETS

        assert set(TARGETS) == {"generic", "megatron", "deepspeed", "dtensor", "meshtf", "torchtitan"}
        assert all(t.execution is not None for t in TARGETS.values())

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [({"engine": "turbo"}, "--engine"), ({"attention": "sparse"}, "--attention")],
    )
    def test_bad_values_are_input_errors_with_the_fix(self, kwargs, message):
        with pytest.raises(InputError, match=message):
            ExecutionModel(**kwargs)
        with pytest.raises(InputError, match=message):
            TrainingSettings(**kwargs)

    def test_unknown_names_in_a_targets_default(self):
        with pytest.raises(InputError, match="--engine"):
            default_execution(("turbo", "flash"))

    def test_settings_carry_it(self):
        assert execution_of(TrainingSettings()) is None
        assert execution_of(TrainingSettings(engine="eager", attention="explicit")) == ExecutionModel(
            engine="eager", attention="explicit"
        )
        assert execution_of(TrainingSettings(attention="explicit")) == ExecutionModel(engine="fused", attention="explicit")


LAYERS, HIDDEN, HEADS, BATCH, SEQ, VOCAB = 2, 128, 4, 2, 256, 512


def _model(graph, **settings):
    cluster = make_cluster("h100-sxm", devices=1)
    return build_cost_model(
        graph, cluster=cluster, settings=TrainingSettings(**settings),
        config_options=ConfigOptions(devices=1, devices_per_node=1),
    )


@pytest.fixture(scope="module")
def graph():
    return gpt2_like(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, positions=SEQ, batch=BATCH, seq=SEQ)


class TestFlash:
    def test_core_memory_is_q_k_v_and_the_log_sum_exp(self, graph):
        """Under flash an attention core keeps Q, K, V (bf16) and one fp32 number per query row, no
        s x s scores: by hand, b s hidden x 2 bytes x 3 + b h s x 4 bytes per layer."""
        settings = TrainingSettings(engine="fused", attention="flash")
        execution = execution_of(settings)
        model = _model(graph, engine="fused", attention="flash")
        space_of = model.tables.configs
        roles = {}
        for core in find_attention_cores(graph):
            roles.update({core.score: "score", core.softmax: "softmax", core.value: "value"})
        total = 0.0
        for index, role in roles.items():
            total += float(saved_activation_bytes(graph.ops[index], space_of[index], tensors=graph.tensors,
                                                  settings=settings, execution=execution, role=role)[0])
        per_layer = 3 * BATCH * SEQ * HIDDEN * 2 + BATCH * HEADS * SEQ * LSE_BYTES
        assert total == LAYERS * per_layer

    def test_explicit_core_keeps_the_scores(self, graph):
        settings = TrainingSettings(engine="fused", attention="explicit")
        model = _model(graph, engine="fused", attention="explicit")
        (core, *_) = find_attention_cores(graph)
        softmax = saved_activation_bytes(graph.ops[core.softmax], model.tables.configs[core.softmax],
                                         tensors=graph.tensors, settings=settings, execution=execution_of(settings),
                                         role="softmax")
        assert float(softmax[0]) == BATCH * HEADS * SEQ * SEQ * 2  # the probabilities, bf16

    def test_flash_time_of_a_core_by_hand(self, graph):
        """The two products at the flash efficiencies, backward 2.5x the FLOPs, one launch forward
        and three backward, softmax inside the kernel (0 s)."""
        model = _model(graph, engine="fused", attention="flash")
        device = model.cluster.device
        core = find_attention_cores(graph)[0]
        peak = device.peak_flops["bf16"]
        bw = device.memory_bandwidth_bytes_per_s * 0.8
        qk = graph.ops[core.score]
        qk_bytes = 2 * BATCH * SEQ * HIDDEN * 2  # reads Q and K, writes no scores
        fwd = max(qk.flops / (peak * FLASH_EFFICIENCY), qk_bytes / bw) + device.kernel_overhead_s
        fwd = max(fwd, device.host_dispatch_s)
        bwd = max(FLASH_BACKWARD_FLOPS_FACTOR * qk.flops / (peak * FLASH_BACKWARD_EFFICIENCY), 2 * qk_bytes / bw)
        bwd = max(bwd + FLASH_BACKWARD_KERNELS * device.kernel_overhead_s, FLASH_BACKWARD_KERNELS * device.host_dispatch_s)
        assert model.op_details[core.score].compute_s[0] == pytest.approx(fwd + bwd, rel=1e-12)
        assert model.op_details[core.softmax].compute_s[0] == 0.0

    def test_flash_uses_less_memory_than_explicit(self, graph):
        flash = _model(graph, engine="fused", attention="flash").evaluate([0] * len(graph.ops))
        explicit = _model(graph, engine="fused", attention="explicit").evaluate([0] * len(graph.ops))
        scores = LAYERS * BATCH * HEADS * SEQ * SEQ * 2
        lse = LAYERS * BATCH * HEADS * SEQ * 4
        # explicit keeps the probabilities of every layer (once: the softmax and the value product
        # save one bf16 tensor) on top of what flash keeps, less flash's fp32 log-sum-exp
        assert explicit.memory.activations_bytes - flash.memory.activations_bytes >= scores - lse


class TestFixedCosts:
    def test_host_bound_step_scales_with_host_dispatch(self, graph):
        """A tiny model on a fast GPU is bound by the host: doubling the host's time per kernel
        doubles every op's time where the host dominates."""
        model = _model(graph, engine="eager", attention="explicit")
        device = model.cluster.device
        slow = dataclasses.replace(device, host_dispatch_s=2 * device.host_dispatch_s, kernel_overhead_s=0.0)
        cluster = dataclasses.replace(model.cluster, device=slow)
        again = build_cost_model(graph, cluster=cluster, settings=model.settings,
                                 config_options=ConfigOptions(devices=1, devices_per_node=1))
        ln = next(i for i, op in enumerate(graph.ops) if op.kind == "norm")
        # a 2 x 256 x 128 LayerNorm: microseconds of traffic, far below 35 us per kernel
        fwd = model.op_details[ln].forward_s[0]
        assert fwd == device.host_dispatch_s  # one kernel, host-bound
        assert again.op_details[ln].forward_s[0] == 2 * device.host_dispatch_s

    def test_plain_roofline_is_unchanged(self, graph):
        """Without an execution model: no fixed cost, no optimizer step (the figures published
        before): a LayerNorm's forward is its bytes at 0.8 of the bandwidth, by hand."""
        plain = _model(graph)
        device = plain.cluster.device
        ln = next(i for i, op in enumerate(graph.ops) if op.kind == "norm")
        op = graph.ops[ln]
        moved = 2 * BATCH * SEQ * HIDDEN * 2 + 2 * HIDDEN * 2  # x in, y out (bf16), weight and bias
        by_hand = max(op.flops / (device.peak_flops["bf16"] * 0.5), moved / (device.memory_bandwidth_bytes_per_s * 0.8))
        assert plain.op_details[ln].forward_s[0] == pytest.approx(by_hand, rel=1e-12)

    def test_optimizer_step_is_priced_per_owned_parameter(self, graph):
        model = _model(graph, engine="fused", attention="flash")
        evaluation = model.evaluate([0] * len(graph.ops))
        without = _model(graph).evaluate([0] * len(graph.ops))
        params = graph.parameter_count
        device = model.cluster.device
        stream = params * 28 / (device.memory_bandwidth_bytes_per_s * 0.8)
        # at least the memory-bound pass over all parameter states (each op: max(stream, host))
        assert evaluation.time.compute_s > without.time.compute_s + stream


class TestKernelCounts:
    def test_eager_linear_with_its_bias_folded_is_one_addmm(self):
        from objectives.compute import folded_nodes, kernel_counts
        from tests.objectives.graphs import GraphBuilder, linear

        g = GraphBuilder("lin")
        x = g.tensor("x", (4, 8), role="input")
        linear(g, "fc", x, ("b", "k"), {"b": 4}, 16, pointwise=1)  # MatMul + the exporter's bias Add
        graph = g.build()
        op = dataclasses.replace(graph.ops[0], onnx_nodes=("matmul", "bias_add"))
        assert folded_nodes(op, graph.tensors) == 0
        counts = kernel_counts(op, ExecutionModel(engine="eager"), parameters=2, biases=1, folded=0)
        # forward: the product and 2 autocast casts; backward: 2 GEMMs, 2 gradient casts, 1 bias reduction
        assert (counts.forward, counts.backward) == (3, 5)
        # the same op with a GeLU folded after the bias: one kernel more forward, two backward
        gelu = dataclasses.replace(op, onnx_nodes=("matmul", "bias_add", "gelu"), fused_pointwise=2)
        assert folded_nodes(gelu, graph.tensors) == 1
        eager = kernel_counts(gelu, ExecutionModel(engine="eager"), parameters=2, biases=1, folded=1)
        assert (eager.forward, eager.backward) == (4, 7)
        fused = kernel_counts(gelu, ExecutionModel(engine="fused"), folded=1)
        assert (fused.forward, fused.backward) == (2, 3)  # the GEMM and its epilogue

    def test_flash_core_is_one_kernel_forward_three_backward(self):
        from objectives.compute import kernel_counts

        graph = gpt2_like(layers=2, hidden=64, heads=4, vocab=64, positions=16, batch=2, seq=16)
        core = find_attention_cores(graph)[0]
        flash = ExecutionModel(engine="fused", attention="flash")
        counts = [kernel_counts(graph.ops[i], flash, role) for i, role in
                  ((core.score, "score"), (core.softmax, "softmax"), (core.value, "value"))]
        assert sum(c.forward for c in counts) == 1
        assert sum(c.backward for c in counts) == FLASH_BACKWARD_KERNELS


class TestOptimizerStep:
    def test_zero1_divides_the_pass_by_the_data_parallel_degree(self):
        from objectives.compute import OPTIMIZER_BYTES_PER_PARAMETER, optimizer_step_time_s
        from planner.core.configs import enumerate_configs
        from tests.objectives.graphs import single_matmul

        graph = single_matmul(64, 4096, 4096)  # w: 16.8M parameters, m (the batch) splits data-parallel
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
        device = make_cluster("h100-sxm", devices=2).device
        row = space.index_of({"m": 2})
        stream = 4096 * 4096 * OPTIMIZER_BYTES_PER_PARAMETER["adam"] / (device.memory_bandwidth_bytes_per_s * 0.8)
        plain = optimizer_step_time_s(op, space, tensors=graph.tensors, device=device, settings=TrainingSettings(),
                                      owned_inputs=[1])
        zero1 = optimizer_step_time_s(op, space, tensors=graph.tensors, device=device,
                                      settings=TrainingSettings(zero_stage=1), owned_inputs=[1])
        assert plain[row] == pytest.approx(stream)
        assert zero1[row] == pytest.approx(stream / 2)


def test_a_plan_is_explained_under_the_execution_model_it_was_priced_with(tmp_path):
    """plan --engine eager --attention explicit writes the model into the plan; explain re-prices
    the plan with it and finds the same step time (a plain-roofline re-pricing would differ)."""
    import json
    from pathlib import Path

    from tests.planner.cli_helpers import run_cli

    gpt2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"
    out = tmp_path / "plan.json"
    common = ["plan", str(gpt2), "-n", "2", "--dim", "batch=4", "--dim", "seq=64", "--target", "generic", "--method", "dp",
              "-q"]  # fmt: skip
    run_cli([*common, "--engine", "eager", "--attention", "explicit", "--pick", "1", "-o", str(out)])
    document = json.loads(out.read_text())
    assert (document["training"]["engine"], document["training"]["attention"]) == ("eager", "explicit")
    explained = json.loads(run_cli(["explain", str(out), "--json"]).stdout)
    assert explained["time_s"] == pytest.approx(document["objectives"]["time_s"], rel=1e-12)
    plain = tmp_path / "plain.json"
    run_cli([*common, "--engine", "roofline", "--pick", "1", "-o", str(plain)])
    assert "engine" not in json.loads(plain.read_text())["training"]
    assert json.loads(plain.read_text())["objectives"]["time_s"] < document["objectives"]["time_s"]


def test_a_launchable_row_is_explained_under_the_execution_model_it_was_priced_with(tmp_path):
    """The same for a row of the launchable table: --engine / --attention override the launcher's
    model, the plan records it, and explain re-prices the row with it to the same step time."""
    import json
    from pathlib import Path

    from tests.planner.cli_helpers import run_cli

    gpt2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"
    out = tmp_path / "plan.json"
    common = ["plan", str(gpt2), "-n", "2", "--dim", "batch=4", "--dim", "seq=64", "--target", "megatron", "-q"]
    run_cli([*common, "--engine", "eager", "--attention", "explicit", "--pick", "1", "-o", str(out)])
    document = json.loads(out.read_text())
    assert (document["training"]["engine"], document["training"]["attention"]) == ("eager", "explicit")
    assert document["training"]["autocast"] is False  # Megatron-LM's Float16Module: bf16 modules, no autocast
    explained = json.loads(run_cli(["explain", str(out), "--json"]).stdout)
    assert explained["execution"] == "eager+explicit"
    assert explained["step_time_s"] == pytest.approx(document["objectives"]["time_s"], rel=1e-12)
    fused = tmp_path / "fused.json"
    run_cli([*common, "--pick", "1", "-o", str(fused)])  # Megatron-LM's own model: fused kernels, and on
    training = json.loads(fused.read_text())["training"]  # an A100 TransformerEngine runs FlashAttention-2
    assert (training["engine"], training["attention"]) == ("fused", "flash")
    assert json.loads(fused.read_text())["objectives"]["time_s"] < document["objectives"]["time_s"]


def test_cluster_files_set_the_fixed_costs(tmp_path):
    from objectives.cluster import load_cluster

    path = tmp_path / "c.yaml"
    path.write_text("device: h100-sxm\nhost_dispatch_s: 2.0e-5\ncollective_overhead_s: 1.0e-5\n"
                    "kernel_overhead_s: 6.0e-6\nnodes: 1\n")
    device = load_cluster(path).device
    assert (device.host_dispatch_s, device.collective_overhead_s, device.kernel_overhead_s) == (2e-5, 1e-5, 6e-6)
    path.write_text("device: h100-sxm\nhost_dispatch_s: -1\nnodes: 1\n")
    with pytest.raises(InputError, match="host_dispatch_s"):
        load_cluster(path)


def _with_masks(graph, mask):
    """``graph`` with every attention softmax recorded as ``mask`` (what importers.attention_masks reads)."""
    softmaxes = {graph.ops[core.softmax].name: mask for core in find_attention_cores(graph)}
    return dataclasses.replace(graph, attention_masks=softmaxes)


class TestCausal:
    """A causal flash kernel computes only the score tiles on and below the diagonal (FlashAttention-2
    section 3.1); explicit attention writes the whole masked matrix."""

    @pytest.mark.parametrize(
        ("seq_q", "seq_k", "head_dim", "fraction"),
        [
            (256, 256, 32, 3 / 4),  # 2 x 2 tiles of 128 x 128: 1 + 2 of 4
            (1024, 1024, 64, 36 / 64),  # 8 x 8 tiles: 1 + ... + 8
            (2048, 2048, 128, 2 * 136 / 512),  # 16 row blocks of 128 x 32 column blocks of 64
            (300, 300, 64, 6 / 9),  # 3 x 3 tiles, the last ones partial: 1 + 2 + 3
            (128, 384, 64, 1.0),  # one query block sees every key (the mask's bottom-right corner)
            (256, 128, 64, 1 / 2),  # the first query block sees no key: skipped
        ],
    )
    def test_tile_fraction_by_hand(self, seq_q, seq_k, head_dim, fraction):
        from objectives.attention import causal_tile_fraction

        assert causal_tile_fraction(seq_q, seq_k, head_dim) == pytest.approx(fraction, rel=1e-12)

    def test_masks_read_from_the_exports(self):
        from pathlib import Path

        from planner.plan import load_graph

        data = Path(__file__).resolve().parents[1] / "data"
        gpt2 = find_attention_cores(load_graph(data / "gpt2_tiny.onnx", {"batch": 2, "seq": 16}))
        bert = find_attention_cores(load_graph(data / "bert_tiny_ts.onnx", {"batch": 2, "seq": 16}))
        assert {core.mask for core in gpt2} == {"causal"}
        assert {core.mask for core in bert} == {"bidirectional"}
        assert {core.flash_work for core in bert} == {1.0}
        assert {core.flash_work for core in gpt2} == {1.0}  # 16 tokens: one 128 x 128 tile, the diagonal's

    def test_causal_flash_core_by_hand(self, graph):
        """s = 256, head dim 32: 3 of the 4 tiles, forward and backward; the softmax stays inside (0 s)."""
        model = _model(_with_masks(graph, "causal"), engine="fused", attention="flash")
        device = model.cluster.device
        core = find_attention_cores(graph)[0]
        bw = device.memory_bandwidth_bytes_per_s * 0.8
        # Q K^T with its folded scale and mask (one FLOP each per score), on 3 of the 4 tiles
        full = 2 * BATCH * HEADS * SEQ * SEQ * (HIDDEN // HEADS) + 2 * BATCH * HEADS * SEQ * SEQ
        assert graph.ops[core.score].flops == full
        flops = 3 / 4 * full
        qk_bytes = 2 * BATCH * SEQ * HIDDEN * 2
        # FlashAttention-2's H100 rates at 512 tokens and head dim 64 (objectives.flash_rates; the
        # nearest measured point): causal forward 180 TFLOP/s on half the square, backward 198 x 180 / 282
        fwd_rate, bwd_rate = 2 * 180e12, 2 * 198e12 * 180 / 282
        fwd = max(max(full / fwd_rate, qk_bytes / bw) + device.kernel_overhead_s, device.host_dispatch_s)
        bwd = max(FLASH_BACKWARD_FLOPS_FACTOR * full / bwd_rate, 2 * qk_bytes / bw)
        bwd = max(bwd + FLASH_BACKWARD_KERNELS * device.kernel_overhead_s, FLASH_BACKWARD_KERNELS * device.host_dispatch_s)
        assert model.op_details[core.score].compute_s[0] == pytest.approx(fwd + bwd, rel=1e-12)
        assert model.op_details[core.softmax].compute_s[0] == 0.0

    def test_recompute_reruns_the_causal_forward(self):
        """Selective recomputation re-runs the causal kernel, at its causal price (2,048 tokens: the
        products are compute-bound, so skipping tiles shows)."""
        long = gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, positions=2048, batch=1, seq=2048)
        model = _model(_with_masks(long, "causal"), engine="fused", attention="flash", recompute="selective")
        core = find_attention_cores(long)[0]
        detail = model.op_details[core.value]
        assert detail.recompute_s[0] == detail.forward_s[0] > 0
        full = _model(long, engine="fused", attention="flash", recompute="selective").op_details[core.value]
        assert full.recompute_s[0] == full.forward_s[0] > detail.forward_s[0]

    def test_explicit_pays_the_whole_matrix(self, graph):
        causal = _model(_with_masks(graph, "causal"), engine="fused", attention="explicit")
        unmasked = _model(graph, engine="fused", attention="explicit")
        for index in find_attention_cores(graph)[0].ops:
            assert causal.op_details[index].compute_s[0] == unmasked.op_details[index].compute_s[0]

    @pytest.mark.parametrize("mask", ["bidirectional", "unknown"])
    def test_bidirectional_and_unknown_are_unchanged(self, graph, mask):
        masked = _model(_with_masks(graph, mask), engine="fused", attention="flash").evaluate([0] * len(graph.ops))
        plain = _model(graph, engine="fused", attention="flash").evaluate([0] * len(graph.ops))
        assert masked.time_s == plain.time_s
        assert masked.memory_bytes == plain.memory_bytes

    def test_causal_flash_step_saves_the_skipped_tiles(self, graph):
        """The whole step under flash: a causal model is faster than the same model unmasked by the
        products' skipped quarter, and its memory is the same (flash keeps no scores either way)."""
        causal = _model(_with_masks(graph, "causal"), engine="fused", attention="flash")
        plain = _model(graph, engine="fused", attention="flash")
        ops = [0] * len(graph.ops)
        saved = sum(plain.op_details[i].compute_s[0] - causal.op_details[i].compute_s[0]
                    for core in find_attention_cores(graph) for i in (core.score, core.value))
        assert saved > 0
        assert plain.evaluate(ops).time_s - causal.evaluate(ops).time_s == pytest.approx(saved, rel=1e-9)
        assert causal.evaluate(ops).memory_bytes == plain.evaluate(ops).memory_bytes


LLAMA_TINY_EXTRA_KERNELS = {False: (21, 43), True: (21 + 7, 43 + 9)}
"""Kernels per llama_tiny layer that PyTorch eager launches beyond the fused engine's (flash attention both), counted
by hand from its ONNX nodes. Forward: two RMSNorms written out in 7 nodes each (pow, mean, add, sqrt, rsqrt, two
muls: 6 beyond the fused norm's one kernel, 12), rotary's two ``rotate_half`` negations (1 each) and its two
cat-mul-add chains (5 and 4 nodes: 4 and 3 beyond one kernel), 21. Backward: a norm's main kernel has 2 and each
written-out node 2 more (14 against the fused norm's 2: 12 each, 24), each negation 2, the chains 8 and 6, and the
SiLU after the gate product 2 against the fused epilogue's 1, 43. Under autocast add a cast of each of the 7 linear
weights forward and a gradient cast of those 7 and the 2 norm weights backward."""


@pytest.mark.parametrize("autocast", [False, True])
def test_eager_host_floor_pays_its_extra_kernels_dispatch(autocast):
    """A host-bound step (a 10 ms layer floor, free compute and traffic, 1 us of host per kernel): the layer floor is
    ``layer_host_s``, fitted on fused Megatron-DeepSpeed kernels; PyTorch eager runs the same layers with more
    kernels, each dispatched by the host, so its floor is higher by those kernels' dispatch (2 layers, one
    micro-batch, one stage). Before the fix both engines sat on the same floor: eager priced as fused exactly
    (h27k, the Megatron GPT-2 eager row at 37.32 ms, the fused one's)."""
    from pathlib import Path

    from planner.estimate import estimate
    from planner.pipeline import graph_loader

    loader = graph_loader(Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx", {"seq": 32})
    cluster = make_cluster("a100-80gb", devices=1)
    dispatch = 1e-6
    device = dataclasses.replace(cluster.device, memory_bandwidth_bytes_per_s=1e30, kernel_overhead_s=0.0,
                                 peak_flops={dtype: 1e30 for dtype in cluster.device.peak_flops},
                                 host_dispatch_s=dispatch, layer_host_s=1e-2, microbatch_host_s=0.0)
    cluster = dataclasses.replace(cluster, device=device)

    def step_s(engine):
        settings = TrainingSettings(engine=engine, attention="flash", autocast=autocast)
        result = estimate(loader, cluster=cluster, tp=1, pp=1, micro_batch=1, global_batch=1, settings=settings)
        assert result.valid
        return result.point.time_s

    forward, backward = LLAMA_TINY_EXTRA_KERNELS[autocast]
    assert step_s("eager") - step_s("fused") == pytest.approx(2 * (forward + backward) * dispatch, rel=1e-6)

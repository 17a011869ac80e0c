"""Issue 25: Megatron-LM's Mamba family (exporters/megatron/mamba.py): Mamba-2 and hybrid stacks read from
the graph (importers/hybrid.py) and exported as ``pretrain_mamba.py``, or refused in one line.

Fixtures: ``tests/exporters/data/nemotron_h_tiny_{dynamo,ts}_consts.onnx``
(``tests/integration/make_megatron_hybrid.py``: transformers' ``NemotronHForCausalLM``, pattern ``M*M-``,
hidden 64, 8 Mamba heads of 16 in 2 groups, state 16, conv 4, attention 4 heads / 2 KV heads of 16,
squared-ReLU MLP of 128, vocabulary 96, untied; torch counts 101,872 parameters) and
``tests/data/mamba2_cases/`` (``tests/importers/make_mamba2_cases.py``: one Mamba-2 layer, 8 heads of 16,
1 group, state 16).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters.megatron import export_megatron, megatron_masks
from exporters._common import describe_config
from exporters.megatron.mamba import hybrid_mask_result, hybrid_refusals, hybrid_stack, settings_refusal
from exporters.megatron.rules import allows
from exporters.validate import parse_megatron_args
from importers.hybrid import MambaSizes, analyze_hybrid, layer_parameters
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, set_split, spaces_for

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "exporters" / "data"
MAMBA2 = ROOT / "tests" / "data" / "mamba2_cases"
ZOO = ROOT / "tests" / "zoo"
DIMS = {"batch": 16, "seq": 16}
HYBRID = ["nemotron_h_tiny_dynamo_consts.onnx", "nemotron_h_tiny_ts_consts.onnx"]


@pytest.fixture(scope="module", params=HYBRID)
def hybrid(request):
    return load_graph(DATA / request.param, DIMS)


def _export(graph, dp, settings=None, global_batch=16):
    spaces = spaces_for(graph, dp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=1)
    assert masks is not None
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=settings or TrainingSettings(),
                                      global_batch=global_batch))


class TestRecognition:
    def test_nemotron_h_sizes(self, hybrid):
        stack = analyze_hybrid(hybrid)
        assert stack is not None and stack.irregular == ()
        assert (stack.pattern, stack.hidden_size, stack.vocab_size, stack.seq_length) == ("M*M-", 64, 96, 16)
        assert stack.mamba == MambaSizes(num_heads=8, head_dim=16, num_groups=2, state_dim=16, conv_kernel=4)
        assert (stack.num_attention_heads, stack.num_query_groups, stack.kv_channels) == (4, 2, 16)
        assert (stack.ffn_hidden_size, stack.mlp, stack.normalization) == (128, "squared-relu", "RMSNorm")
        assert not stack.tied_embeddings and stack.causal and not stack.rotary

    def test_a_zero_centred_norm_is_refused(self, tmp_path):
        # layer 0's input norm rewired to scale by 1 + w (as Gemma's RMSNorm does): --apply-layernorm-1p
        # would reach megatron-core 0.16.1's TENorm layers but not MambaMixer's gated norm (mamba_ssm's
        # RMSNormGated), so the stack is refused in one clause, not exported as a plain-norm model
        import onnx
        from onnx import TensorProto, helper

        model = onnx.load(str(DATA / HYBRID[1]), load_external_data=False)
        mul = next(n for n in model.graph.node if n.name == "/model/model/layers.0/norm/Mul_1")
        weight = next(name for name in mul.input if name.startswith("onnx::"))  # the norm's scale, a constant
        mul.input[list(mul.input).index(weight)] = "scale_1p"
        at = list(model.graph.node).index(mul)
        model.graph.node.insert(at, helper.make_node("Add", [weight, "one"], ["scale_1p"], name="norm_1p/Add"))
        model.graph.node.insert(at, helper.make_node(
            "Constant", [], ["one"], name="norm_1p/Constant", value=helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])))
        path = tmp_path / "zero_centred_hybrid.onnx"
        onnx.save(model, str(path))
        plain, edited = analyze_hybrid(load_graph(DATA / HYBRID[1], DIMS)), analyze_hybrid(load_graph(path, DIMS))
        assert plain.irregular == ()
        (clause,) = edited.irregular
        assert "1 + w" in clause and clause in hybrid_refusals(edited)

    def test_parameter_count_by_hand(self, hybrid):
        stack = analyze_hybrid(hybrid)
        # Mamba: norm 64 + in_proj 64 x (2*128 + 2*2*16 + 8) + conv 192 x (4 + 1) + 3 x 8 + norm 128 + out 128 x 64
        assert layer_parameters("M", stack.mamba, 64) == 64 + 64 * 328 + 192 * 5 + 24 + 128 + 128 * 64 == 30_360
        # attention: norm + Q 64x64 + K, V 64x32 + O 64x64; MLP: norm + 64x128 + 128x64
        assert layer_parameters("*", (4, 2, 16), 64) == 64 + 4096 + 2 * 2048 + 4096 == 12_352
        assert layer_parameters("-", (128, "squared-relu"), 64) == 64 + 2 * 8192 == 16_448
        layers = 2 * 30_360 + 12_352 + 16_448
        assert 96 * 64 + layers + 64 + 96 * 64 == hybrid.parameter_count == 101_872  # torch's count at export

    @pytest.mark.parametrize("style", ["dynamo_bare", "ts_bare", "dynamo_consts", "ts_consts"])
    def test_mamba2_alone(self, style):
        stack = analyze_hybrid(load_graph(MAMBA2 / f"mamba2_{style}.onnx", DIMS))
        assert stack is not None and stack.irregular == () and stack.pattern == "M"
        assert stack.mamba == MambaSizes(num_heads=8, head_dim=16, num_groups=1, state_dim=16, conv_kernel=4)

    @pytest.mark.parametrize("name", ["gpt2_ts_bare", "llama_dynamo_bare", "convnext_dynamo_bare", "bloom_ts_bare"])
    def test_other_models_have_no_stack(self, name):
        # ConvNeXt's depthwise convs are 2-D ([C, 1, k, k]); a Mamba mixer's is 1-D
        assert analyze_hybrid(load_graph(ZOO / f"{name}.onnx", DIMS)) is None


class TestExport:
    def test_flags(self, hybrid):
        out = _export(hybrid, 4, TrainingSettings(zero_stage=1))
        args = parse_megatron_args(out["args"])
        assert out["script"] == "pretrain_mamba.py" and out["model_family"] == "mamba" and out["world_size"] == 4
        assert "pretrain_mamba.py" in out["command"]
        assert (args["hybrid-override-pattern"], args["num-layers"], args["hidden-size"]) == ("M*M-", 4, 64)
        assert (args["mamba-num-heads"], args["mamba-head-dim"], args["mamba-num-groups"], args["mamba-state-dim"]) == (
            8, 16, 2, 16)
        assert (args["num-attention-heads"], args["num-query-groups"], args["ffn-hidden-size"]) == (4, 2, 128)
        assert args["squared-relu"] and args["position-embedding-type"] == "none" and args["normalization"] == "RMSNorm"
        assert args["spec"] == ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
        assert args["disable-bias-linear"] and args["untie-embeddings-and-output-weights"]
        assert "swiglu" not in args and "kv-channels" not in args  # 4 heads x 16 = hidden 64
        # 16 samples per step over 4 ranks, one micro-batch
        assert (args["micro-batch-size"], args["global-batch-size"], args["tensor-model-parallel-size"]) == (4, 16, 1)
        assert args["use-distributed-optimizer"]

    def test_pure_mamba(self):
        out = _export(load_graph(MAMBA2 / "mamba2_dynamo_consts.onnx", DIMS), 2)
        args = parse_megatron_args(out["args"])
        assert args["hybrid-override-pattern"] == "M" and args["mamba-num-groups"] == 1
        assert args["num-attention-heads"] == 1 and "squared-relu" not in args  # satisfies TransformerConfig only
        assert any("no attention layer" in note for note in out["notes"])


class TestRefusals:
    def test_context_parallelism_is_not_listed(self, hybrid):
        assert megatron_masks(hybrid, spaces_for(hybrid, 4), dp=2, tp=1, cp=2) is None

    @pytest.mark.parametrize(("recompute", "offload", "phrase"), [
        ("full", "none", "checkpoints no layers"), ("none", "activations", "offloads no activations")])
    def test_what_mamba_stack_does_not_run(self, hybrid, recompute, offload, phrase):
        assert phrase in settings_refusal(recompute, offload)
        from exporters.megatron import TARGET

        families = TARGET.families(hybrid, spaces_for(hybrid, 4), devices=4, devices_per_node=4, pp=1)
        # tp=4 is not listed: MambaMixer needs the 2 groups divisible by tp (TestTensorParallel)
        assert {(f.dp, f.tp, f.sp) for f in families} == {(1, 1, False), (2, 1, False), (4, 1, False), (1, 2, False),
                                                          (1, 2, True), (2, 2, False), (2, 2, True)}
        family = next(f for f in families if f.dp == 4)
        cluster = make_input(hybrid, spaces_for(hybrid, 4), first_rows(family.masks)).cluster
        assert not allows(family, TrainingSettings(recompute=recompute, offload=offload), cluster, hybrid)
        with pytest.raises(UnsupportedExport, match=phrase):
            _export(hybrid, 4, TrainingSettings(recompute=recompute, offload=offload))

    @pytest.mark.parametrize(("change", "phrase"), [
        (dict(mamba=MambaSizes(num_heads=8, head_dim=16, num_groups=2, state_dim=16, conv_kernel=3)), "spans 3 tokens"),
        (dict(mlp="relu"), "ReLU"),
        (dict(rotary=True), "rotary"),
        (dict(causal=False), "causal"),
        (dict(irregular=("layer 1 (*): 12,416 parameters where ...",)), "12,416"),
    ])
    def test_each_refusal_is_one_clause(self, hybrid, change, phrase):
        (clause,) = hybrid_refusals(dataclasses.replace(analyze_hybrid(hybrid), **change))
        assert phrase in clause and "\n" not in clause

    def test_refused_stack_exports_in_one_line(self, hybrid, monkeypatch):
        import exporters.megatron.mamba as mamba

        real = mamba.analyze_hybrid
        monkeypatch.setattr(mamba, "analyze_hybrid", lambda g: dataclasses.replace(real(g), rotary=True))
        mamba._STACKS.clear()
        try:
            assert megatron_masks(hybrid, spaces_for(hybrid, 2), dp=2, tp=1) is None
            spaces = spaces_for(hybrid, 2)
            plan = make_input(hybrid, spaces, [0] * len(spaces))
            with pytest.raises(UnsupportedExport) as info:
                export("megatron", plan)  # the one door: it names the launchers that run the plan (exporters.elsewhere)
        finally:
            mamba._STACKS.clear()
        reason = str(info.value)
        assert "\n" not in reason and "pretrain_mamba.py" in reason and "--target deepspeed" in reason

    def test_bare_files_have_no_data_parallel_split(self):
        # the scan's CumSum axes are constants a bare file lacks: the importer cannot split them by the batch
        graph = load_graph(MAMBA2 / "mamba2_dynamo_bare.onnx", DIMS)
        assert hybrid_stack(graph) is not None
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None


def _export_tp(graph, *, dp=2, tp=2, sp=False, settings=None, change=None):
    """The export of the first row of the ``dp x tp`` masks (``change``: op name -> factors of another row)."""
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=dp * tp)
    assert masks is not None
    choice = first_rows(masks)
    for name, factors in (change or {}).items():
        choice = set_split(graph, spaces, choice, name, factors)
    return export_megatron(make_input(graph, spaces, choice, settings=settings or TrainingSettings(zero_stage=1),
                                      global_batch=16))


def _split_of(graph, spaces, masks, index) -> set[str]:
    """Every configuration the mask allows op ``index``, described."""
    return {describe_config(graph.ops[index], spaces[index], int(r)) for r in np.flatnonzero(masks[index])}


class TestTensorParallel:
    """MambaMixer at tp=2 on the hybrid fixture (8 heads of 16 in 2 groups, state 16; megatron-core 0.16.1
    ``ssm/mamba_mixer.py``): nheads_local_tp = 8 / 2 = 4, ngroups_local_tp = 2 / 2 = 1, d_inner_local_tp
    = 128 / 2 = 64, conv_dim = 64 + 2 x 1 x 16 = 96, in_proj column-parallel over 2 x 128 + 2 x 2 x 16 + 8
    = 328 outputs (164 per rank), out_proj row-parallel over d_inner."""

    def test_mixer_ops_split_as_megatron(self, hybrid):
        spaces = spaces_for(hybrid, 2)
        masks = megatron_masks(hybrid, spaces, dp=1, tp=2, devices_per_node=2)
        assert masks is not None
        ops = hybrid.ops
        in_proj = next(i for i, op in enumerate(ops) if op.kind == "matmul" and op.dim("n").size == 328)
        conv = next(i for i, op in enumerate(ops) if op.kind == "conv")
        out_proj = next(i for i, op in enumerate(ops) if i > conv and op.kind == "matmul" and "Einsum" not in op.node_types)
        assert ops[conv].dim(ops[conv].dims[1].name).size == 192  # x, B, C: 128 + 2 x 2 x 16
        assert _split_of(hybrid, spaces, masks, in_proj) == {"n=2"}  # 164 of 328 per rank
        assert _split_of(hybrid, spaces, masks, conv) == {"g=2"}  # 96 channels per rank
        # d_inner read as (2 groups, 64) after dynamo's gated norm, as 128 after TorchScript's: half per rank
        assert _split_of(hybrid, spaces, masks, out_proj) in ({"k_0=2"}, {"k=2"})
        scans = [i for i, op in enumerate(ops[:out_proj]) if "Einsum" in op.node_types]
        assert scans and all(_split_of(hybrid, spaces, masks, i) == {"h=2"} for i in scans)  # 4 heads per rank
        norm = next(i for i, op in enumerate(ops) if op.kind == "norm" and op.dims[-1].size == 64 and i > conv)
        assert _split_of(hybrid, spaces, masks, norm) == {"d2=2"}  # the gated norm: one group per rank
        # the Splits of in_proj's and the conv's outputs: priced whole (module docstring of mamba_tp)
        splits = [i for i, op in enumerate(ops[:out_proj]) if "Split" in op.node_types]
        assert len(splits) == 2 and all(_split_of(hybrid, spaces, masks, i) == {"replicated"} for i in splits)
        assert _split_of(hybrid, spaces, masks, 1) == {"replicated"}  # the layer's input norm, without sp

    def test_sequence_parallel_splits_norms_and_residuals(self, hybrid):
        spaces = spaces_for(hybrid, 2)
        masks = megatron_masks(hybrid, spaces, dp=1, tp=2, sequence_parallel=True, devices_per_node=2)
        residual = next(i for i, op in enumerate(hybrid.ops) if op.node_types == ("Add",) and op.dims[-1].size == 64)
        assert _split_of(hybrid, spaces, masks, 1) == {"d1=2"} and _split_of(hybrid, spaces, masks, residual) == {"d1=2"}

    @pytest.mark.parametrize(("path", "tp", "phrase"), [
        (DATA / HYBRID[0], 4, "--mamba-num-groups (2) divisible by tp=4"),
        (MAMBA2 / "mamba2_dynamo_consts.onnx", 2, "--mamba-num-groups (1) divisible by tp=2"),
    ])
    def test_groups_not_divisible_are_refused(self, path, tp, phrase):
        graph = load_graph(path, DIMS)
        spaces = spaces_for(graph, tp)
        assert megatron_masks(graph, spaces, dp=1, tp=tp, devices_per_node=tp) is None
        result = hybrid_mask_result(graph, spaces, hybrid_stack(graph), dp=1, tp=tp)
        assert result.masks is None and phrase in result.reason and "\n" not in result.reason

    @pytest.mark.parametrize("sp", [False, True])
    def test_export_tp2(self, hybrid, sp):
        out = _export_tp(hybrid, sp=sp)
        args = parse_megatron_args(out["args"])
        assert (out["world_size"], out["nproc_per_node"], out["degrees"]["tp"], out["degrees"]["dp"]) == (4, 4, 2, 2)
        assert args["tensor-model-parallel-size"] == 2 and bool(args.get("sequence-parallel")) == sp
        assert out["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # ZeRO-1 with tp > 1, as the GPT family
        # 16 samples per step over dp=2: 8 per rank
        assert (args["micro-batch-size"], args["global-batch-size"]) == (8, 16)
        assert any("whole on every tp rank" in note for note in out["notes"])

    def test_a_split_megatron_does_not_run_is_refused(self, hybrid):
        in_proj = next(op.name for op in hybrid.ops if op.kind == "matmul" and op.dim("n").size == 328)
        with pytest.raises(UnsupportedExport) as info:
            _export_tp(hybrid, change={in_proj: {"b0": 2}})  # in_proj replicated over tp: not column-parallel
        assert in_proj in str(info.value) and "n=2" in str(info.value) and "\n" not in str(info.value)


def test_listed_rows_are_the_exported_ones(hybrid):
    """Every target's mask membership equals its exporter's answer on the hybrid fixture, tp=2 families
    included (as tests/exporters/test_targets.py checks the GPT and Llama graphs): a Megatron row the
    search lists is one export_megatron accepts, a choice outside every family is refused."""
    from exporters import runnable_targets
    from exporters.targets import runnable_targets_of
    from tests.exporters.test_targets import _choices

    spaces = spaces_for(hybrid, 4, 4)
    cluster = make_cluster(1, 4)
    choices = _choices(hybrid, spaces, 4, 4, np.random.default_rng(3), random_rows=2)
    megatron_rows = 0
    for settings in (TrainingSettings(zero_stage=1), TrainingSettings(recompute="selective")):
        column = runnable_targets_of(hybrid, spaces, cluster, settings, choices)
        for choice, names in zip(choices, column):
            assert names == runnable_targets(make_input(hybrid, spaces, choice, cluster=cluster, settings=settings))
            megatron_rows += "megatron" in names
    assert megatron_rows > 0


def _pipeline_input(graph, layers, *, dp=1, tp=2, schedule="1f1b", chunks=1, settings=None):
    """A pp = len(layers) plan of ``graph`` at dp x tp per stage, stage s holding the next ``layers[s]``
    layers of the stack (cut after their residual adds), 4 micro-batches of 4 samples."""
    from exporters.generic import PipelineSpec, StageSpec
    from exporters.megatron.mamba_tp import hybrid_rules

    settings = settings or TrainingSettings(zero_stage=1)
    ops = graph.ops
    ends = [i for i, r in enumerate(hybrid_rules(graph)) if r.role == "residual" and ops[i].node_types == ("Add",)]
    cuts, done = [-1], 0
    for count in layers[:-1]:
        done += count
        cuts.append(ends[done - 1])
    cuts.append(len(ops) - 1)
    stages = tuple(StageSpec(index=s, layers=(s, s + 1), ops=tuple(range(cuts[s] + 1, cuts[s + 1] + 1)))
                   for s in range(len(layers)))
    spec = PipelineSpec(pp=len(layers), devices_per_stage=dp * tp, schedule=schedule, chunks=chunks,
                        micro_batch=4 // dp, micro_batches=4, global_batch=16, zero_stage=settings.zero_stage,
                        recompute=settings.recompute, stages=stages)
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, devices_per_node=dp * tp)
    return make_input(graph, spaces, first_rows(masks), settings=settings, micro_batch=4, global_batch=16,
                      pipeline=spec, cluster=make_cluster(1, dp * tp * len(layers)))


class TestPipeline:
    """MambaStack's placement (megatron-core 0.16.1 ``ssm/mamba_block.py``
    ``_select_layers_for_pipeline_parallel``): num_layers // pp per rank, or the first / last rank's
    count from --decoder-first/last-pipeline-num-layers and the rest evenly; no virtual stages."""

    def test_even_stages(self, hybrid):
        out = export_megatron(_pipeline_input(hybrid, [2, 2]))
        args = parse_megatron_args(out["args"])
        # 2 stages x dp=1 x tp=2: 4 ranks; MambaStack gives each rank 4 // 2 = 2 layers: "M*" and "M-"
        assert (out["world_size"], out["degrees"]["pp"], out["pipeline"]["layers_per_stage"]) == (4, 2, [2, 2])
        assert args["pipeline-model-parallel-size"] == 2 and "decoder-first-pipeline-num-layers" not in args
        assert args["hybrid-override-pattern"] == "M*M-" and args["micro-batch-size"] == 4

    def test_uneven_stages_name_first_and_last(self, hybrid):
        args = parse_megatron_args(export_megatron(_pipeline_input(hybrid, [1, 3]))["args"])
        assert (args["decoder-first-pipeline-num-layers"], args["decoder-last-pipeline-num-layers"]) == (1, 3)

    @pytest.mark.parametrize(("change", "phrase"), [
        (dict(schedule="interleaved", chunks=2), "without virtual stages"),
        (dict(settings=TrainingSettings(zero_stage=3)), "Megatron-FSDP"),
    ])
    def test_refused_in_one_line(self, hybrid, change, phrase):
        layers = [2, 2]
        with pytest.raises(UnsupportedExport) as info:
            export_megatron(_pipeline_input(hybrid, layers, **change))
        assert phrase in str(info.value) and "\n" not in str(info.value)

    def test_a_cut_inside_a_layer_is_refused(self, hybrid):
        plan = _pipeline_input(hybrid, [2, 2])
        first, second = plan.pipeline.stages
        moved = dataclasses.replace(first, ops=first.ops[:-1])  # the residual add of layer 1 moves to stage 1
        pipeline = dataclasses.replace(plan.pipeline, stages=(moved, dataclasses.replace(
            second, ops=(first.ops[-1], *second.ops))))
        with pytest.raises(UnsupportedExport, match="cuts layer 1"):
            export_megatron(dataclasses.replace(plan, pipeline=pipeline))

    def test_stage_rule_is_the_exporter(self, hybrid):
        from exporters._target import Family
        from exporters.megatron.rules import stage_rule

        for layers, change, runs in (([2, 2], {}, True), ([1, 3], {}, True), ([2, 2], dict(chunks=2, schedule="interleaved"), False),
                                     ([2, 2], dict(settings=TrainingSettings(zero_stage=1, recompute="full")), False)):
            plan = _pipeline_input(hybrid, layers, **change)
            family = Family(label="dp=1 x tp=2", tp=2, dp=1, masks=())
            assert stage_rule(family, plan) == runs
            if not runs:
                with pytest.raises(UnsupportedExport):
                    export_megatron(plan)

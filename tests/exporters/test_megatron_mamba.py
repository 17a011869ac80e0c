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

import pytest

from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.mamba import hybrid_refusals, hybrid_stack, settings_refusal
from exporters.megatron.rules import allows
from exporters.validate import parse_megatron_args
from importers.hybrid import MambaSizes, analyze_hybrid, layer_parameters
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

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
    def test_tensor_and_context_parallelism_are_not_listed(self, hybrid):
        spaces = spaces_for(hybrid, 4)
        assert megatron_masks(hybrid, spaces, dp=2, tp=2) is None
        assert megatron_masks(hybrid, spaces, dp=2, tp=2, sequence_parallel=True) is None
        assert megatron_masks(hybrid, spaces, dp=2, tp=1, cp=2) is None

    @pytest.mark.parametrize(("recompute", "offload", "phrase"), [
        ("full", "none", "checkpoints no layers"), ("none", "activations", "offloads no activations")])
    def test_what_mamba_stack_does_not_run(self, hybrid, recompute, offload, phrase):
        assert phrase in settings_refusal(recompute, offload)
        from exporters.megatron import TARGET

        families = TARGET.families(hybrid, spaces_for(hybrid, 4), devices=4, devices_per_node=4, pp=1)
        assert {(f.dp, f.tp) for f in families} == {(1, 1), (2, 1), (4, 1)}  # data parallel only
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
                export_megatron(plan)
        finally:
            mamba._STACKS.clear()
        reason = str(info.value)
        assert "\n" not in reason and "pretrain_mamba.py" in reason and "--target deepspeed" in reason

    def test_bare_files_have_no_data_parallel_split(self):
        # the scan's CumSum axes are constants a bare file lacks: the importer cannot split them by the batch
        graph = load_graph(MAMBA2 / "mamba2_dynamo_bare.onnx", DIMS)
        assert hybrid_stack(graph) is not None
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None

"""Issue 25, task H3: importer readings a sweep found wrong.

Fixtures: ``tests/data/importer_sweep_cases/`` (``tests/importers/make_importer_sweep_cases.py``: transformers 5.24,
random weights, graph-only; ``counts.json`` holds torch's counts and the configs) and the Mamba-1 / Jamba files of
earlier tasks (``tests/data/table_weight_cases/mamba1_ts_bare.onnx``, traced at 16 tokens;
``tests/data/moe_sweep_cases/jamba_ts_bare.onnx``).

1. A Mamba-1 traced by TorchScript has its selective scan unrolled at the example's length: bound to another
   length the file does not compute, and the import refuses in one line naming the traced length
   (:mod:`importers.unrolled_loop`); at the traced length it imports with torch's parameter count.
2. Jamba (Mamba-1 + SwiGLU MLP, attention + MoE): the hybrid reader reads the SwiGLU MLP as SwiGLU (its input
   norm's ``Mul`` was read as quick-GELU's scale), pre-norm from the op that reads the residual stream (mask ops
   come first in the graph's order), the MoE layers as ``E``, and says first what megatron-core cannot build:
   the Mamba-1 mixers, once for all the layers that have them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model
from importers.hybrid import analyze_hybrid, layer_parameters
from importers.transformer import analyze_transformer
from planner.core.errors import ModelError
from planner.pricing import load_graph
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "importer_sweep_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
MAMBA1_AT_8 = CASES / "mamba1_seq8_ts_bare.onnx"
MAMBA1_AT_16 = ROOT / "tests" / "data" / "table_weight_cases" / "mamba1_ts_bare.onnx"
JAMBA = CASES / "jamba_swiglu_ts_bare.onnx"


class TestUnrolledScan:
    @pytest.mark.parametrize("seq", [4096, 16, 4])
    def test_another_length_is_refused_naming_the_traced_one(self, seq):
        traced = COUNTS["mamba1_seq8_ts"]["config"]["example_seq"]  # the length torch traced the loop at: 8
        with pytest.raises(ModelError) as refused:
            import_model(MAMBA1_AT_8, {"batch": 2, "seq": seq})
        text = str(refused.value)
        assert "\n" not in text
        assert f"unrolled at {traced} steps" in text and f"positions 0..{traced - 1}" in text
        assert f"only at seq={traced}, not seq={seq}" in text and text.endswith(f"--dim seq={traced}")

    def test_each_file_names_its_own_traced_length(self):
        with pytest.raises(ModelError, match=r"unrolled at 16 steps .* or plan with --dim seq=16$"):
            import_model(MAMBA1_AT_16, {"batch": 2, "seq": 4096})

    def test_the_traced_length_imports_with_torchs_count(self):
        graph = import_model(MAMBA1_AT_8, {"batch": 2, "seq": 8})
        assert graph.parameter_count == COUNTS["mamba1_seq8_ts"]["param_count"]  # 47,328, torch's
        # every value has a shape: nothing left out of the cost
        assert not any("could not compute the shapes" in w for w in graph.warnings)

    def test_a_specialised_axis_is_named(self):
        # torch's dynamo exporter specialises the loop's length: transformers' MambaForCausalLM exported with a
        # Dim("seq") has input_ids [batch, 8], so --dim seq is ignored; the warning names the fixed axis
        from onnx import TensorProto, helper

        from importers.shapes import resolve_shapes

        x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["batch", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
        model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["input_ids"], ["y"])], "g", [x], [y]),
                                  opset_imports=[helper.make_opsetid("", 18)])
        warned = " ".join(resolve_shapes(model, {"batch": 2, "seq": 4096}).warnings)
        assert "--dim seq: not a dim of the model's inputs, ignored (its named dims: batch; fixed in the file: " \
               "input_ids[1] = 8, so planning another size needs a re-export with that axis dynamic)" in warned

    def test_cli_exits_2_in_one_line(self):
        result = run_cli(["plan", MAMBA1_AT_8, "-n", "8", "--dim", "batch=8", "--dim", "seq=4096"],
                         expected_exit_code=2)
        lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert len(lines) == 1 and "unrolled at 8 steps" in lines[0] and "Traceback" not in result.stderr


def _jamba_letters(config: dict) -> str:
    """The ``--hybrid-override-pattern`` letters of a Jamba config: each decoder layer is a mixer (attention where
    ``i % attn_layer_period == attn_layer_offset``, else Mamba) then a feed-forward (MoE where
    ``i % expert_layer_period == expert_layer_offset``, else the dense MLP); transformers' JambaModel."""
    out = ""
    for i in range(config["num_hidden_layers"]):
        out += "*" if i % config["attn_layer_period"] == config["attn_layer_offset"] else "M"
        out += "E" if i % config["expert_layer_period"] == config["expert_layer_offset"] else "-"
    return out


@pytest.fixture(scope="module")
def stack():
    return analyze_hybrid(load_graph(JAMBA, {"batch": 2, "seq": 8}))


class TestJamba:
    def test_layers_and_swiglu(self, stack):
        config = COUNTS["jamba_swiglu_ts"]["config"]
        assert stack.pattern == _jamba_letters(config) == "M-*EM-*E"
        assert (stack.mlp, stack.ffn_hidden_size, stack.hidden_size) == ("swiglu", config["intermediate_size"], 32)
        # a dense layer's parameters are megatron-core's SwiGLU MLP: norm 32 + gate, up [32, 64] and down [64, 32]
        assert layer_parameters("-", (64, "swiglu"), 32) == 32 + 3 * 32 * 64

    def test_refusal_names_mamba1_first_once(self, stack):
        config = COUNTS["jamba_swiglu_ts"]["config"]
        d_inner = config["mamba_expand"] * config["hidden_size"]  # 64 conv channels
        x_proj = config["mamba_dt_rank"] + 2 * config["mamba_d_state"]  # dt, B and C: 12
        assert len(stack.irregular) == 1, stack.irregular
        (mamba,) = stack.irregular
        assert mamba.startswith("layers 0 and 4 (M): a Mamba-1 mixer")
        assert f"the conv's {d_inner} channels to {x_proj}" in mamba
        # the E layers are read whole as megatron-core builds them (h27e): their sizes, no clause
        experts = stack.experts
        assert (experts.num_experts, experts.top_k, experts.ffn, experts.activation) == (
            config["num_experts"], config["num_experts_per_tok"], config["intermediate_size"], "swiglu")
        assert not any("pre-norm" in c or "parameters where" in c for c in stack.irregular)

    def test_earlier_jamba_file(self):
        stack = analyze_hybrid(load_graph(ROOT / "tests" / "data" / "moe_sweep_cases" / "jamba_ts_bare.onnx",
                                          {"batch": 2, "seq": 16}))
        assert (stack.pattern, stack.mlp) == ("M-*E", "swiglu")
        assert [c.split(":")[0] for c in stack.irregular] == ["layer 0 (M)"]  # layer 3 (E) is read whole (h27e)

    def test_pure_mamba1_said_once_for_both_layers(self):
        stack = analyze_hybrid(load_graph(MAMBA1_AT_8, {"batch": 2, "seq": 8}))
        assert stack.pattern == "MM" and len(stack.irregular) == 1
        assert stack.irregular[0].startswith("layers 0 and 1 (M): a Mamba-1 mixer")

    def test_count_is_torchs(self):
        assert load_graph(JAMBA, {"batch": 2, "seq": 8}).parameter_count == COUNTS["jamba_swiglu_ts"]["param_count"]

    def test_transformer_reading_names_the_mixers_first(self):
        model = analyze_transformer(load_graph(JAMBA, {"batch": 2, "seq": 8}))
        assert model.irregular[0] == "2 Mamba mixer(s) beside its attention, e.g. /model/layers.0/mamba/Conv"


@pytest.fixture(scope="module")
def graph():
    """StableLM with ``qk_layernorm=True`` at batch 8 of 16 tokens."""
    return load_graph(CASES / "stablelm_qk_ts_bare.onnx", {"batch": 8, "seq": 16})


class TestStableLmPerHeadNorms:
    """3. StableLM's QK LayerNorm is one norm per head, each its own weights (``per-head-weights``): DeepSpeed AutoTP
    and a DTensor plan keep the norms whole while a rank holds 1/tp of the heads, and the module pairs norms and
    local heads in order (``tests/integration/test_stablelm_per_head_norm.py`` runs transformers' module), so
    neither lists tp > 1; Megatron-LM refuses the model by name (one shared weight)."""

    DEVICES = 8

    def test_read_as_per_head_weights(self, graph):
        model = analyze_transformer(graph)
        assert model.features.qk_norm == "per-head-weights"
        assert model.num_attention_heads == COUNTS["stablelm_qk_ts"]["config"]["num_attention_heads"] == 4
        assert graph.parameter_count == COUNTS["stablelm_qk_ts"]["param_count"]  # 210,816, torch's

    @pytest.mark.parametrize("launcher", ["deepspeed", "dtensor"])
    @pytest.mark.parametrize("dynamo", [False, True])
    def test_no_tensor_parallel_family(self, graph, launcher, dynamo):
        from importlib import import_module

        from tests.exporters.graphs import spaces_for

        if dynamo:  # the same model through torch's dynamo exporter (tests/importers/make_reader_cases.py)
            graph = load_graph(ROOT / "tests" / "data" / "reader_cases" / "stablelm_qk_dynamo_bare.onnx",
                               {"batch": 8, "seq": 16})
        rules = import_module(f"exporters.{launcher}.rules")
        found = rules.families(graph, spaces_for(graph, self.DEVICES), devices=self.DEVICES,
                               devices_per_node=self.DEVICES, pp=1)
        assert found and {f.tp for f in found} == {1}  # dp = 1, 2, 4, 8 stay
        why = rules.per_head_weights_tp(graph)
        assert why.startswith("its queries and keys are normalised by one LayerNorm per head") and why.endswith("plan tp=1")

    @pytest.mark.parametrize("launcher", ["deepspeed", "dtensor"])
    def test_a_shared_weight_model_keeps_its_tp_rows(self, launcher):
        from importlib import import_module

        from tests.exporters.graphs import spaces_for

        graph = load_graph(ROOT / "tests" / "data" / "llama_tiny.onnx", {"batch": 8, "seq": 16})
        rules = import_module(f"exporters.{launcher}.rules")
        found = rules.families(graph, spaces_for(graph, self.DEVICES), devices=self.DEVICES,
                               devices_per_node=self.DEVICES, pp=1)
        assert rules.per_head_weights_tp(graph) is None and max(f.tp for f in found) > 1


class TestDetrPostLn:
    """4. DETR's layers are post-LN (transformers 5.24 ``DetrEncoderLayer`` / ``DetrDecoderLayer``:
    ``hidden_states = residual + hidden_states`` then the layer's norm), but its queries and keys read
    ``x + positions`` while the residual add reads ``x``, and the decoder starts from zero queries: the post-LN
    reading took them for pre-LN. Now either operand of a plain ``Add`` writing the sub-layer's input is its
    stream, and a sub-layer whose stream is a constant decides nothing."""

    @pytest.mark.parametrize("path", [
        CASES / "detr_ts_bare.onnx",  # DetrForObjectDetection, encoder and decoder
        *(ROOT / "tests" / "data" / "param_cases" / f"detr_{e}_{s}.onnx"  # a DETR-style decoder, both exporters
          for e in ("ts", "dynamo") for s in ("bare", "consts")),
    ])
    def test_read_post_ln(self, path):
        dims = {"batch": 2} if "importer_sweep" in str(path) else {"batch": 4, "seq": 16}
        assert analyze_transformer(load_graph(path, dims)).features.post_layernorm


def _frozen(name: str) -> int:
    """Torch's frozen parameters of a case: all parameters less those with ``requires_grad``."""
    return COUNTS[name]["param_count"] - COUNTS[name]["trainable_count"]


class TestFrozenPositionTables:
    """5. A frozen sinusoidal table is written as a learned one by both exporters (a named initializer gathered at
    ``arange``), so it is counted, with one warning where its shape and use match the tables transformers freezes
    (:mod:`importers.frozen_positions`)."""

    @pytest.mark.parametrize("name, dims, tables", [
        ("marian_ts", {"batch": 2, "seq": 16, "tgt_seq": 8}, 2),  # encoder's and decoder's, 128 x 64 each
        ("roformer_ts", {"batch": 2, "seq": 16}, 1),  # one head wide: 128 x 16
    ])
    def test_one_warning_with_torchs_frozen_count(self, name, dims, tables):
        graph = load_graph(CASES / f"{name}_bare.onnx", dims)
        notes = [w for w in graph.warnings if w.startswith("position table(s)")]
        assert len(notes) == 1 and "\n" not in notes[0]
        assert notes[0].count("embed_positions.weight") == tables
        assert f"its trained count is {_frozen(name):,} lower" in notes[0]  # 16,384 and 2,048, torch's

    @pytest.mark.parametrize("path", ["tests/zoo/gpt2_ts_bare.onnx", "tests/zoo/bart_ts_bare.onnx",
                                      "tests/zoo/bart_ts_consts.onnx", "tests/zoo/whisper_ts_bare.onnx"])
    def test_learned_tables_are_not_warned(self, path):
        # GPT-2's wpe (tokens unscaled), BART's (row 2 first), Whisper's decoder table (tokens unscaled): learned
        graph = load_graph(ROOT / path, {"batch": 2, "seq": 16, "tgt_seq": 8})
        assert not any(w.startswith("position table(s)") for w in graph.warnings)

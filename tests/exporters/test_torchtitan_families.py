"""torchtitan's qwen3 and deepseek_v3 families (issues 24 item 6, 25): a Qwen3 exports to
``torchtitan.models.qwen3`` with its sizes, head size, per-head QK-norm, rotary base and norm epsilon;
a dense multi-latent-attention model to ``torchtitan.models.deepseek_v3`` with its latent and head
sizes and every layer dense; the llama3 family writes the file's base and epsilon too; what no
family builds is refused in one line.

The numbers asserted are read here from the fixture's ONNX protobuf, independently of the importer:
the initializers' shapes (embedding ``[vocab, hidden]``, ``q_norm.weight`` ``[head_dim]``, the Q / K
projections ``[hidden, heads x head_dim]`` / ``[hidden, kv_heads x head_dim]``, the MLP's
``[hidden, ffn]``), the rotary ``inv_freq`` constant (base ``b`` from ``theta_1 = b^(-1/n)``) and
the RMSNorm's ``Add`` of epsilon after its ``ReduceMean``; the MLA sizes from the config the MLA
fixtures were traced from (``tests/data/mla_cases/counts.json``). The written module is read back with
``ast`` (no torchtitan here; ``tests/integration/test_torchtitan_families_export.py`` builds it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from exporters import export
from exporters.torchtitan import families, parse_torchtitan_overrides, torchtitan_masks
from exporters.torchtitan.families import family_refusals
from importers.rotary import RotaryFrequencies
from importers.transformer import MoeSummary, analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, pipeline_spec, spaces_for

DATA = Path(__file__).resolve().parent / "data"
MLA = Path(__file__).resolve().parents[2] / "tests" / "data" / "mla_cases"
QWEN3 = DATA / "qwen3_tiny.onnx"
QWEN3_MOE = DATA / "qwen3_moe_tiny.onnx"
LLAMA = Path(__file__).resolve().parents[2] / "examples" / "llama.onnx"
DIMS = {"batch": 8, "seq": 16}


def _file_facts(path: Path) -> dict:
    """Sizes (from the initializers' names and shapes: Hugging Face module names), rotary base and
    epsilon read from the protobuf alone (module docstring)."""
    proto = onnx.load(str(path), load_external_data=False)
    shapes = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    vocab, hidden = next(s for n, s in shapes.items() if "embed_tokens" in n)
    facts = {"vocab": vocab, "hidden": hidden, "shapes": Counter(s for n, s in shapes.items() if "MatMul" in n)}
    facts |= {"head_dim": s[0] for n, s in shapes.items() if "q_norm" in n}
    values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer if not t.external_data}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    # inv_freq: 1-D, starting at 1 and falling: theta_i = b^(-i/n), so b = theta_1^(-n)
    inv_freq = next(v for v in values.values() if v.ndim == 1 and v.size > 2 and v[0] == 1.0 and np.all(np.diff(v) < 0))
    facts["theta"] = round(float(inv_freq[1]) ** -inv_freq.size)
    # RMSNorm: mean(x^2) + eps, the Add of a scalar to a ReduceMean's output
    writer = {out: node.op_type for node in proto.graph.node for out in node.output}
    facts["eps"] = {float(values[b].reshape(-1)[0]) for node in proto.graph.node if node.op_type == "Add"
                    for a, b in (node.input, node.input[::-1]) if writer.get(a) == "ReduceMean" and b in values}
    return facts


def _calls(text: str) -> dict[str, dict]:
    """``{function name: {keyword: literal}}`` of the calls in the written module with literal keywords."""
    out: dict[str, dict] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            out.setdefault(name, {}).update(
                {k.arg: ast.literal_eval(k.value) for k in node.keywords if isinstance(k.value, ast.Constant)})
    return out


def _assigned(text: str, names: str) -> tuple:
    """The literal tuple assigned to ``names`` (e.g. ``"dim, vocab, eps"``) in the written module."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]).strip("()") == names:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{names} not assigned")


def _export(path: Path, dp: int, tp: int, *, sp: bool = True, settings: TrainingSettings | None = None):
    graph = load_graph(path, DIMS)
    spaces = spaces_for(graph, dp * tp)
    masks = torchtitan_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp)
    assert masks is not None
    return export("torchtitan", make_input(graph, spaces, first_rows(masks), cluster=make_cluster(1, dp * tp),
                                           settings=settings or TrainingSettings(zero_stage=3)))


class TestQwen3:
    def test_the_module_builds_the_files_qwen3(self):
        facts = _file_facts(QWEN3)
        hidden, head_dim = facts["hidden"], facts["head_dim"]
        # the projections from the hidden size: k / v [hidden, kv x hd], q [hidden, heads x hd], the MLP's, the head's
        widths = sorted({s[1] for s in facts["shapes"] if s[0] == hidden})
        ffn = widths[2]
        assert widths[3:] == [facts["vocab"]]
        kv_heads, heads = widths[0] // head_dim, widths[1] // head_dim
        assert (hidden, head_dim, heads, kv_heads, ffn, facts["vocab"]) == (128, 16, 4, 2, 256, 512)
        assert heads * head_dim != hidden  # Qwen3's free head size, which llama3 cannot build

        out = _export(QWEN3, 2, 2)
        text, model = out["config_file"]["text"], out["model"]
        calls = _calls(text)
        layers = calls["qwen3._build_qwen3_layers"]
        assert layers == {"n_layers": 2, "n_heads": heads, "n_kv_heads": kv_heads, "head_dim": head_dim,
                          "hidden_dim": ffn, "attn_backend": "flex"}
        assert calls["CosSinRoPE.Config"] == {"dim": head_dim, "max_seq_len": DIMS["seq"], "theta": facts["theta"]}
        assert facts["theta"] == 10000  # Qwen3Config's default, not the qwen3 presets' 1e6: read, not assumed
        (eps,) = facts["eps"]
        assert _assigned(text, "dim, vocab, eps") == (hidden, facts["vocab"], pytest.approx(eps))
        assert eps == pytest.approx(1e-6)
        assert calls["Qwen3Model.Config"] == {"enable_weight_tying": False}  # the file's LM head is its own [128, 512]
        assert "layer.attention.qk_norm.eps = eps" in text and "config_registry.qwen3_0_6b()" in text
        assert "from torchtitan.models.qwen3.model import Qwen3Model" in text and "llama3" not in text
        assert model["family"] == "qwen3" and model["qk_norm"] and model["head_dim"] == head_dim
        assert (model["rope_theta"], model["norm_eps"]) == (facts["theta"], pytest.approx(eps))
        assert not any("not in the model file" in note for note in out["notes"])  # both read
        assert "qwen3_0_6b's data and tokenizer settings" in out["notes"][0]

    def test_tp_divides_the_kv_heads(self):
        graph = load_graph(QWEN3, DIMS)
        spaces = spaces_for(graph, 4)
        assert torchtitan_masks(graph, spaces, dp=2, tp=2) is not None
        assert torchtitan_masks(graph, spaces, dp=1, tp=4) is None  # 2 KV heads (Decoder.Config.update_from_config)

    def test_pipeline_of_an_untied_qwen3(self):
        graph = load_graph(QWEN3, DIMS)
        settings = TrainingSettings(zero_stage=3)
        spec = pipeline_spec(graph, [1, 1], devices_per_stage=1, micro_batch=8, micro_batches=2, settings=settings)
        out = export("torchtitan", make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops),
                                              cluster=make_cluster(1, 2), settings=settings,
                                              global_batch=spec.global_batch, pipeline=spec))
        parts = out["overrides"][out["overrides"].index("--parallelism.module_fqns_per_model_part") + 1:][:2]
        assert parts == ["tok_embeddings,layers.0", "layers.1,norm,lm_head"]

    def test_family_clauses(self):
        model = analyze_transformer(load_graph(QWEN3, DIMS))
        assert family_refusals(model, "qwen3") == []
        llama = family_refusals(model, "llama3")  # head size 16 x 4 != 128, and QK-norm
        assert len(llama) == 2 and "16 x 4 heads is not the hidden size 128" in llama[0] and "QK-norm" in llama[1]
        plain = dataclasses.replace(model, features=dataclasses.replace(model.features, qk_norm="none"))
        assert family_refusals(plain, "qwen3") == [
            "it does not normalise each head of its queries and keys (the family's per-head QK-norm)"]
        whole = dataclasses.replace(model, features=dataclasses.replace(model.features, qk_norm="whole-projection"))
        assert "over the whole projection (OLMo-2)" in family_refusals(whole, "qwen3")[0]


class TestLlama3ReadsTheFile:
    def test_theta_and_eps_written_from_the_file(self):
        """examples/llama.onnx holds inv_freq (base 10000) and RMSNorm eps 1e-6; llama3's builder would use 1e-5."""
        facts = _file_facts(LLAMA)
        out = _export(LLAMA, 4, 1, sp=False)
        text = out["config_file"]["text"]
        assert _calls(text)["ComplexRoPE.Config"]["theta"] == facts["theta"] == 10000
        (eps,) = facts["eps"]
        assert _assigned(text, "dim, vocab, eps")[2] == pytest.approx(eps) == pytest.approx(1e-6)
        assert "layer.attention_norm.eps = layer.ffn_norm.eps = eps" in text and "qk_norm" not in text
        assert out["model"]["family"] == "llama3" and "head_dim=" not in text


def _experts_from_file(path: Path) -> dict:
    """The routed experts read from the protobuf: the batched expert weights ``gate_up_proj`` ``[E, 2 F, H]``
    and ``down_proj`` ``[E, H, F]`` per layer, the TopK's ``k`` constant, and a ``ReduceSum`` of the
    TopK's values (the renormalisation ``norm_topk_prob`` adds)."""
    proto = onnx.load(str(path), load_external_data=False)
    shapes = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    gate_up = [s for n, s in shapes.items() if n.endswith("experts.gate_up_proj")]
    down = [s for n, s in shapes.items() if n.endswith("experts.down_proj")]
    values = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
              if n.op_type == "Constant" and n.attribute[0].name == "value"}
    topks = [n for n in proto.graph.node if n.op_type == "TopK"]
    summed = {i for n in proto.graph.node if n.op_type == "ReduceSum" for i in n.input}
    return {"layers": len(gate_up), "experts": gate_up[0][0], "ffn": down[0][2], "gate_up": gate_up[0][1],
            "top_k": int(values[topks[0].input[1]].reshape(-1)[0]),
            "renormalized": topks[0].output[0] in summed}


class TestQwen3Moe:
    def test_every_layer_routes_as_the_file_does(self):
        experts = _experts_from_file(QWEN3_MOE)
        assert experts["gate_up"] == 2 * experts["ffn"]  # SwiGLU experts: gate and up fused
        out = _export(QWEN3_MOE, 2, 2, sp=False)  # batched experts have no sequence dim to split: no sp
        text = out["config_file"]["text"]
        layers = _calls(text)["qwen3._build_qwen3_moe_layers"]
        assert layers == {"n_layers": experts["layers"], "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                          "moe_hidden_dim": experts["ffn"], "num_experts": experts["experts"],
                          "top_k": experts["top_k"], "attn_backend": "flex", "moe_comm_backend": "standard"}
        assert (experts["experts"], experts["top_k"], experts["ffn"]) == (4, 2, 64)  # make_qk_norm_fixtures
        assert f"layer.moe.router.route_norm = {experts['renormalized']}" in text and experts["renormalized"]
        assert "layer.moe.load_balance_coeff = None" in text  # Hugging Face's router has no routing bias
        assert out["model"]["experts"] == {"num_experts": 4, "top_k": 2, "renormalized": True}
        assert parse_torchtitan_overrides(out["overrides"])["parallelism.tensor_parallel_degree"] == 2

    def test_a_router_without_renormalisation(self):
        """Qwen3-MoE's norm_topk_prob false (Qwen2-MoE's default): the helper's route_norm=True set back."""
        from exporters.torchtitan.config_module import torchtitan_config_module

        arch = families.torchtitan_arch(load_graph(QWEN3_MOE, DIMS))
        plain = dataclasses.replace(arch, moe=dataclasses.replace(arch.moe, renormalized=False))
        assert "layer.moe.router.route_norm = False" in torchtitan_config_module(plain)

    def test_what_the_moe_layers_cannot_run(self):
        graph = load_graph(QWEN3_MOE, DIMS)
        spaces = spaces_for(graph, 4)
        choice = first_rows(torchtitan_masks(graph, spaces, dp=4, tp=1))
        for settings, message in ((TrainingSettings(zero_stage=0, expert_parallel=2), "borrows its ranks from dp_shard"),
                                  (TrainingSettings(zero_stage=3, capacity_factor=1.25), "drops no token")):
            with pytest.raises(UnsupportedExport, match=message):
                export("torchtitan", make_input(graph, spaces, choice, cluster=make_cluster(1, 4), settings=settings))

    def test_moe_clauses(self):
        model = analyze_transformer(load_graph(QWEN3_MOE, DIMS))
        moe = MoeSummary(layers=2, num_experts=4, top_k=2)
        assert families.moe_refusals(model, families.FAMILIES["qwen3"], moe) == []
        assert "1 of its 2 layers route" in families.moe_refusals(model, families.FAMILIES["qwen3"],
                                                                  dataclasses.replace(moe, layers=1))[0]
        assert "sigmoid" in families.moe_refusals(model, families.FAMILIES["qwen3"],
                                                  dataclasses.replace(moe, score_function="sigmoid"))[0]
        assert "llama3 has no MoE layer" in families.moe_refusals(model, families.FAMILIES["llama3"], moe)[0]


class TestDeepseekV3:
    @pytest.mark.parametrize("name", ["mla_ts_bare", "mla_lite_ts_consts"])
    def test_dense_mla_is_deepseek_v3_with_every_layer_dense(self, name):
        counts = json.loads((MLA / "counts.json").read_text())
        hf = counts["configs"][counts["files"][f"{name}.onnx"]["case"]]
        facts = _file_facts(MLA / f"{name}.onnx")
        out = _export(MLA / f"{name}.onnx", 2, 2)
        text = out["config_file"]["text"]
        calls = _calls(text)
        layers = hf["num_hidden_layers"]
        assert calls["deepseek_v3._build_dsv3_layers"].items() >= {
            "n_layers": layers, "n_dense_layers": layers, "n_heads": hf["num_attention_heads"],
            "q_lora_rank": hf["q_lora_rank"] or 0, "kv_lora_rank": hf["kv_lora_rank"],
            "qk_nope_head_dim": hf["qk_nope_head_dim"], "qk_rope_head_dim": hf["qk_rope_head_dim"],
            "v_head_dim": hf["v_head_dim"], "dense_hidden_dim": hf["intermediate_size"]}.items()
        assert calls["ComplexRoPE.Config"] == {"dim": hf["qk_rope_head_dim"], "max_seq_len": DIMS["seq"],
                                               "theta": facts["theta"]}
        (eps,) = facts["eps"]
        assert _assigned(text, "dim, vocab, eps") == (hf["hidden_size"], hf["vocab_size"], pytest.approx(eps))
        assert "layer.attention.q_norm.eps = layer.attention.kv_norm.eps = eps" in text
        assert calls["DeepSeekV3Model.Config"] == {"enable_weight_tying": hf["tie_word_embeddings"]}
        assert out["model"]["family"] == "deepseek_v3" and "config_registry.deepseek_v3_debugmodel()" in text

    def test_yarn_is_refused(self):
        graph = load_graph(MLA / "mla_yarn_ts_consts.onnx", DIMS)
        # transformers' DeepseekV3Attention: 24 ** -0.5 x (0.1 ln 4 + 1) ** 2 = 1/sqrt(14.2785) with YaRN's mscale
        with pytest.raises(UnsupportedExport, match=r"torchtitan's deepseek_v3 family would train a different model: "
                                                    r"it scales its attention scores by 1/sqrt\(14\.2785\), not "
                                                    r"1/sqrt\(24\).*its rotary frequencies are not a geometric series .*YaRN"):
            families.torchtitan_arch(graph)

    def test_the_norms_are_counted(self):
        """qwen3_tiny has 2 x 4 + 1 = 9 norms (input, post-attention, q_norm, k_norm per layer; the final);
        llama3's 2 layers have 2 x 2 + 1 = 5, deepseek_v3's with a query latent 2 x 4 + 1 = 9."""
        graph = load_graph(QWEN3, DIMS)
        model = analyze_transformer(graph)
        assert families._norm_count(graph, model, families.FAMILIES["qwen3"]) == ""
        # llama3 has no QK-norm: its refusal says so, and the count the QK-norms explain is not said again
        assert families._norm_count(graph, model, families.FAMILIES["llama3"]) == ""
        unexplained = dataclasses.replace(model, features=dataclasses.replace(model.features, qk_norm="none"))
        assert families._norm_count(graph, unexplained, families.FAMILIES["llama3"]) == (
            "it has 9 norms where torchtitan's llama3 of 2 layers has 5 (2 per layer and the final one)")


class TestRefusals:
    @pytest.mark.parametrize(("name", "family", "clauses"), [
        # query_pre_attn_scalar 256 for a head size of 16 (make_qk_norm_fixtures)
        ("gemma3_tiny", "qwen3", ["not SwiGLU", "sandwich norms", "by 1/sqrt(256), not 1/sqrt(16)", "by a factor"]),
        ("olmo2_tiny", "llama3", ["(x + norm(f(x)), OLMo-2's reordered norm)", "QK-norm"]),
        ("qwen2_moe_tiny", "llama3", ["biases", "routes tokens to experts"]),
        # DeepSeek-V3 itself, graph-only without its small constants: routed_scaling_factor's constant is lost
        # (with it, tests/exporters/test_torchtitan_deepseek_moe.py writes its MoE layers)
        ("../../data/moe_cases/deepseek_v3_dynamo_bare", "deepseek_v3", ["route_scale must say it"]),
    ])
    def test_one_line_with_every_reason(self, name, family, clauses):
        graph = load_graph(DATA / f"{name}.onnx", DIMS)
        spaces = spaces_for(graph, 2)
        with pytest.raises(UnsupportedExport) as caught:
            export("torchtitan", make_input(graph, spaces, [0] * len(graph.ops), cluster=make_cluster(1, 2)))
        reason = caught.value.reason
        assert "\n" not in reason and reason.startswith(f"torchtitan's {family} family would train a different model: ")
        for clause in clauses:
            assert clause in reason

    @pytest.mark.parametrize(("found", "clause"), [
        (RotaryFrequencies(pairs=8, geometric=False, base=None), "not a geometric series"),
        (RotaryFrequencies(pairs=4, geometric=True, base=10000.0), "rotates 8 channels of its 16-channel head"),
    ])
    def test_a_rope_the_family_cannot_say(self, monkeypatch, found, clause):
        monkeypatch.setattr(families, "rotary_frequencies", lambda path: found)
        with pytest.raises(UnsupportedExport, match=clause):
            families.torchtitan_arch(load_graph(QWEN3, DIMS))

    def test_a_sliding_window_narrower_than_the_sequence(self):
        """The zoo's Mistral (sliding_window 64, tests/zoo/make_zoo.py): at 64 tokens its mask is causal
        attention's, exported with a note; at 128 the family would see keys the model does not."""
        mistral = Path(__file__).resolve().parents[1] / "zoo" / "mistral_ts_consts.onnx"
        arch = families.torchtitan_arch(load_graph(mistral, {"batch": 2, "seq": 64}))
        assert (arch.family.name, arch.window) == ("llama3", 64)
        with pytest.raises(UnsupportedExport, match="sliding window of 64 tokens .*narrower than its 128-token sequence"):
            families.torchtitan_arch(load_graph(mistral, {"batch": 2, "seq": 128}))

    def test_norms_with_different_epsilons(self, monkeypatch):
        monkeypatch.setattr(families, "layer_norm_epsilons", lambda graph: (1e-6, 1e-5))
        with pytest.raises(UnsupportedExport, match=r"its norms' epsilons differ \(1e-06, 1e-05\)"):
            families.torchtitan_arch(load_graph(QWEN3, DIMS))


@pytest.mark.parametrize(("name", "clause"), [
    # T5 reads its shared word table again for the decoder's tokens (both exporters write a second gather of it)
    ("t5_dynamo_consts", "it looks its word table up a second time (an encoder-decoder's decoder embeds its own tokens)"),
    ("t5_ts_bare", "it looks its word table up a second time (an encoder-decoder's decoder embeds its own tokens)"),
    # BERT's learned positions (read from their indices: importers.position_table), not its word table again
    ("bert_dynamo_consts", "it learns a position table, the family embeds tokens only"),
])
def test_the_table_beside_the_word_embedding_is_named_for_what_it_is(name, clause):
    graph = load_graph(Path(__file__).resolve().parents[1] / "zoo" / f"{name}.onnx", DIMS | {"tgt_seq": 16})
    assert clause in "; ".join(family_refusals(analyze_transformer(graph), "llama3", graph))

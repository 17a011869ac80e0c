"""Issue 25: what ``--target megatron`` (and torchtitan's family check) says of ALBERT, ELECTRA and a BERT whose
LM head applies GELU's tanh approximation (``exporters/megatron/families.py``).

* ALBERT and ELECTRA are post-LN (``tests/importers/test_post_ln_cases.py``): after what no megatron-core
  0.16.1 model class builds (shared layers, the factorised embedding) the refusal names the post-LN, which
  ``BertModel``'s pre-LN ``TransformerLayer`` cannot compute.
* ``BertLMHead`` applies ``torch.nn.functional.gelu`` (erf), set in its constructor
  (``models/bert/bert_lm_head.py:42``; ``tests/integration/test_megatron_bert_head.py`` runs it), so a head
  transform with the tanh approximation is trained as erf with a note, as the MLPs' is (``family_notes``: the
  two differ by at most 4.7e-4); it used to be refused as "its LM head reads the last layer directly" plus
  "1 linear layer(s) beside the masked-LM head", both wrong (the head has its dense, GELU and norm). Each
  file's GELUs are counted in its protobuf: ``Tanh`` nodes, no ``Erf``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from exporters.megatron.families import family_notes, megatron_family
from exporters.torchtitan.families import family_refusals as torchtitan_refusals
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "post_ln_cases"
DIMS = {"batch": 16, "seq": 16}
POST_LN = ("it normalises after each residual add (post-LN, as BERT, RoBERTa and BART) and Megatron-Core's BERT "
           "layer normalises before it (pre-LN: megatron-core 0.16.1 reads apply_residual_connection_post_layernorm "
           "nowhere)")
TANH_HEAD_NOTE = ("the model's LM head transform uses GELU's tanh approximation and Megatron's BertLMHead applies "
                  "erf GELU, set in its constructor with no flag to change it (megatron-core 0.16.1 "
                  "models/bert/bert_lm_head.py:42): the two differ by at most 4.7e-4, at x = -2.70")
TOKEN_TYPES = ("it adds a token-type embedding (2 rows) and Megatron's BERT has one only with the binary head "
               "(num_tokentypes = 2 if --bert-binary-head in pretrain_bert.py)")
ELSEWHERE = "; export as the generic plan"  # a direct call's; exporters.export names the launchers that run the plan


def _clauses(path: Path, prefix: str) -> list[str]:
    graph = load_graph(path, DIMS)
    with pytest.raises(UnsupportedExport) as caught:
        megatron_family(graph, analyze_transformer(graph))
    message = str(caught.value)
    assert message.startswith(prefix) and message.endswith(ELSEWHERE) and "\n" not in message
    return message[len(prefix):-len(ELSEWHERE)].split("; ")


def _gelus(path: Path) -> Counter:
    graph = onnx.load(str(path), load_external_data=False).graph
    return Counter(n.op_type for n in graph.node if n.op_type in ("Tanh", "Erf", "Gelu"))


@pytest.mark.parametrize("name", ["electra_ts_bare.onnx", "electra_dynamo_bare.onnx"])
def test_electra_is_told_its_embedding_then_its_post_ln(name: str) -> None:
    # ElectraConfig(embedding_size=32, hidden_size=64); ElectraSelfOutput: LayerNorm(dense(h) + input)
    assert _clauses(CASES / name, "Megatron-LM would train a different model: ") == [
        "its token embeddings are 32 wide and its layers 64 (a factorised embedding, as ALBERT's: a linear layer "
        "projects them) and Megatron-Core's embedding is as wide as its layers", POST_LN]


@pytest.mark.parametrize("path", [CASES / "albert_ts_bare.onnx",
                                  ROOT / "tests" / "data" / "outside_zoo" / "albert_dynamo_bare.onnx"])
def test_albert_is_told_its_post_ln_third(path: Path) -> None:
    clauses = _clauses(path, "Megatron-LM would train a different model: ")
    assert len(clauses) == 3 and clauses[0].startswith("its layers share their weights")
    assert clauses[1].startswith("its token embeddings are 32 wide") and clauses[2] == POST_LN


@pytest.mark.parametrize(("name", "tanh"), [("bert_gelu_tanh_ts_bare.onnx", 3), ("bert_gelu_new_dynamo_bare.onnx", 3)])
def test_hugging_face_bert_with_a_tanh_gelu_head(name: str, tanh: int) -> None:
    # 2 MLPs and the head transform, each GELU's tanh approximation (x * (1 + tanh(...)) / 2: one Tanh each)
    assert _gelus(CASES / name) == Counter(Tanh=tanh)
    clauses = _clauses(CASES / name, "Megatron-LM's BERT (pretrain_bert.py) would train a different model: ")
    assert clauses == [POST_LN, TOKEN_TYPES]  # the tanh head is a note, not a reason


def test_megatron_shaped_bert_with_a_tanh_head_exports_with_a_note() -> None:
    # tests/integration/make_megatron_bert.py's BERT with F.gelu(approximate="tanh"): pre-LN, no embedding norm,
    # 2 x 2 + 2 norms, the head's dense / GELU / norm; only the GELUs differ (3 Tanh, the untouched file's 3 Erf)
    path = CASES / "megatron_bert_tanh_dynamo.onnx"
    assert _gelus(path) == Counter(Tanh=3)
    assert _gelus(ROOT / "tests" / "exporters" / "data" / "megatron_bert_tiny.onnx") == Counter(Erf=3)
    graph = load_graph(path, DIMS)
    model = analyze_transformer(graph)
    family = megatron_family(graph, model)
    assert family.family == "bert" and family.head_activation == "gelu-tanh"
    notes = family_notes(family, [], mlp_activation=model.features.mlp_activation)
    assert notes[0].startswith("the model's MLP uses GELU's tanh approximation") and notes[1] == TANH_HEAD_NOTE
    erf = load_graph(ROOT / "tests" / "exporters" / "data" / "megatron_bert_tiny.onnx", DIMS)
    erf_model = analyze_transformer(erf)
    assert not any("tanh" in n for n in family_notes(megatron_family(erf, erf_model), [],
                                                      mlp_activation=erf_model.features.mlp_activation))


def test_the_cli_lists_megatron_for_the_tanh_head() -> None:
    path = CASES / "megatron_bert_tanh_dynamo.onnx"
    result = run_cli(["plan", path, "-n", 2, "--dim", "batch=16", "--dim", "seq=16", "--target", "megatron", "-q",
                      "--json"])
    assert "megatron" in json.loads(result.stdout)["launchers"] and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["electra_ts_bare.onnx", "albert_ts_bare.onnx"])
def test_torchtitan_names_the_post_ln(name: str) -> None:
    graph = load_graph(CASES / name, DIMS)
    clauses = torchtitan_refusals(analyze_transformer(graph), "llama3")
    assert "its sub-layers are not pre-norm in sequence (post-LN or parallel attention and MLP)" in clauses

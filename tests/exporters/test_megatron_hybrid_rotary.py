"""Rotary embeddings in the hybrid export (``pretrain_mamba.py``; issue 25, h28f).

Before, any hybrid stack whose graph computes sines or cosines was refused ("the export does not prove that every
attention layer applies them"), and Falcon-H1's clause said its frequencies were not one geometric series where
they were (``rope_theta`` 10,000; the head size was unread, a parallel layer's). megatron-core 0.16.1's
``MambaModel`` takes ``--position-embedding-type rope`` with ``--rotary-base`` / ``--rotary-percent`` and rotates
every attention layer; the export now reads which layers rotate and writes those flags, or names the difference.

Files: ``tests/data/hybrid_cases`` (``tests/exporters/make_hybrid_cases.py``): ``granite_h_rope``
(``GraniteMoeHybridForCausalLM`` with ``position_embedding_type="rope"``, one attention layer of 16-channel
heads) and ``falcon_h1_parallel``. The expected base, 10,000, is transformers 5.24's default ``rope_theta`` of
both configs (neither sets it); megatron-core's own ``RotaryEmbedding`` is compared with transformers' rotary
tables in ``tests/integration/test_megatron_hybrid_rotary.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.mamba import hybrid_refusals, hybrid_stack
from exporters.megatron.mamba_rotary import hybrid_rotary
from exporters.validate import parse_megatron_args
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "hybrid_cases"
RECORD = json.loads((CASES / "counts.json").read_text())["files"]
ROPE = "granite_h_rope_dynamo_consts.onnx"
FALCON = "falcon_h1_parallel_dynamo_consts.onnx"
DIMS = {"batch": 2, "seq": 16}
THETA = 10000  # transformers 5.24 GraniteMoeHybridConfig / FalconH1Config default rope_theta


def _export(name: str, tp: int = 1) -> dict:
    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 2)
    masks = megatron_masks(graph, spaces, dp=2 // tp, tp=tp)
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(zero_stage=1),
                                      global_batch=16))


@pytest.mark.parametrize("tp", [1, 2])
def test_a_rotary_granite_exports_megatrons_rope(tp: int):
    config = RECORD[ROPE]["config"]
    graph = load_graph(CASES / ROPE, DIMS)
    assert config["position_embedding_type"] == "rope" and hybrid_refusals(hybrid_stack(graph), graph) == []
    out = _export(ROPE, tp)
    args = parse_megatron_args(out["args"])
    assert args["position-embedding-type"] == "rope" and args["rotary-base"] == THETA
    assert "rotary-percent" not in args  # every channel of each head turns: Megatron's default 1.0
    assert "use-rope-scaling" not in args and "no-rope-freq" not in args
    assert args["hybrid-override-pattern"] == "M-*-" and args["tensor-model-parallel-size"] == tp
    head = config["hidden_size"] // config["num_attention_heads"]
    assert any(f"base {THETA} over {head} of {head} channels" in note for note in out["notes"])


def test_a_stack_without_rotary_keeps_none():
    graph = load_graph(CASES / "granite_h_plain_dynamo_consts.onnx", DIMS)
    assert hybrid_rotary(hybrid_stack(graph), graph).args == ("--position-embedding-type", "none")


def test_falcon_h1_is_refused_for_its_parallel_layer_only():
    """Both of Falcon-H1's attention blocks rotate queries and keys with base 10,000 over the 16-channel heads (its
    config's head_dim): what MambaModel would build; the parallel hybrid layer alone refuses it."""
    config = RECORD[FALCON]["config"]
    graph = load_graph(CASES / FALCON, DIMS)
    stack = hybrid_stack(graph)
    assert hybrid_rotary(stack, graph).args == ("--position-embedding-type", "rope", "--rotary-base", str(THETA))
    assert config["head_dim"] == 16
    refusals = hybrid_refusals(stack, graph)
    assert len(refusals) == 1 and "parallel hybrid layer" in refusals[0]


@pytest.mark.parametrize("turned, said", [(("none",), "0 neither its queries nor its keys"),
                                          (("both", "query"), "1 its queries only")])
def test_attention_layers_that_do_not_all_rotate_are_refused_by_name(monkeypatch, turned, said):
    """MambaModel rotates every attention layer or none: a graph whose layers differ is refused, naming them (the
    per-layer reading is importers.rotary.rotated_layers', tested there; here its answer is replaced)."""
    import exporters.megatron.mamba_rotary as mamba_rotary

    graph = load_graph(CASES / ROPE, DIMS)
    monkeypatch.setattr(mamba_rotary, "rotated_layers", lambda graph, attention: turned)
    found = mamba_rotary._hybrid_rotary(hybrid_stack(graph), graph)  # (read again: not the kept answer)
    assert found.args == () and said in found.refusal and "MambaModel hands one RotaryEmbedding" in found.refusal

"""A TorchScript export without its weights cannot show whether the LM head is tied (issue 25, a new user's
sweep: Gemma-2's TorchScript DTensor plan recorded ``tied_embeddings: false`` with no word, its dynamo plan
true). The TorchScript exporter writes a tied head as a constant of its own (``onnx::MatMul_N``, the word
table transposed), exactly as it writes an untied head's folded weight, and a graph-only file holds no values
to compare (the importer counts it, with a warning). Every launcher that writes the tie now notes it, as the
Megatron-LM export did: DTensor and torchtitan too. The dynamo export names the shared weight: tied, no note.

Oracles: ``tests/zoo/zoo.json``'s ``tied_param_count`` (torch's tied parameters: GPT-2 ties its head,
``vocab_size x n_embd``), and the initializers' names and shapes in the files.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from exporters import export
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ZOO = Path(__file__).resolve().parents[2] / "tests" / "zoo"
CONFIGS = json.loads((ZOO / "zoo.json").read_text())["files"]
DIMS = {"batch": 2, "seq": 16}


def _replicated(path: Path):
    graph = load_graph(path, DIMS)
    return make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))


def _head_copy(path: Path, table: str) -> str:
    """The ``onnx::MatMul_N`` initializer shaped as ``table`` transposed: the head the exporter wrote."""
    shapes = {t.name: tuple(t.dims) for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    (copy,) = [n for n in shapes if n.startswith("onnx::MatMul_") and shapes[n] == tuple(reversed(shapes[table]))]
    return copy


def _tie_notes(document: dict) -> list[str]:
    return [note for note in document["notes"] if "transposed copy when the two are tied" in note]


def test_gpt2_dtensor_plan_notes_the_head_torch_ties():
    config = CONFIGS["gpt2_ts_bare.onnx"]
    assert config["tied_param_count"] == config["config"]["vocab_size"] * config["config"]["n_embd"]  # torch ties it
    ts, dynamo = ZOO / "gpt2_ts_bare.onnx", ZOO / "gpt2_dynamo_bare.onnx"
    copy = _head_copy(ts, "transformer.wte.weight")
    document = export("dtensor", _replicated(ts))
    assert document["model"]["tied_embeddings"] is False  # what the file shows
    (note,) = _tie_notes(document)
    assert note.startswith(f"the LM head's weight {copy} is a constant the TorchScript exporter made")
    assert "plan its dynamo export" in note
    tied = export("dtensor", _replicated(dynamo))
    assert tied["model"]["tied_embeddings"] is True and _tie_notes(tied) == []


@pytest.mark.parametrize("target, remedy", [("torchtitan", "set enable_weight_tying=True"),
                                            ("megatron", "drop --untie-embeddings-and-output-weights")])
def test_every_launcher_that_writes_the_tie_notes_it(target, remedy):
    # the zoo's Llama is untied (tied_param_count 0): its TorchScript head reads as a tied one would, so the
    # note says what to change if the model ties them; the dynamo file names both weights and needs none
    assert CONFIGS["llama_ts_bare.onnx"]["tied_param_count"] == 0
    ts = ZOO / "llama_ts_bare.onnx"
    (note,) = _tie_notes(export(target, _replicated(ts)))
    assert note.startswith(f"the LM head's weight {_head_copy(ts, 'model.embed_tokens.weight')} is a constant")
    assert remedy in note
    assert _tie_notes(export(target, _replicated(ZOO / "llama_dynamo_bare.onnx"))) == []

"""What a Megatron-LM export says about an LM head is what the file shows (issue 25, task H2, item 4).

A TorchScript export writes a tied head as a constant of its own (``onnx::MatMul_N``, the word table
transposed) and records no buffers, so BART's, Pegasus' and Marian's ``final_logits_bias`` (a registered
buffer, never trained) reads as a head bias. The T5 family's refusal said "its untied vocabulary projection
has a bias" of heads that torch ties and whose "bias" is that buffer; it now says what the file cannot tell.
The GPT family wrote ``--untie-embeddings-and-output-weights`` for such a head without a word; it now
notes it. Oracles: torch's own model (``tests/exporters/make_head_cases.py`` prints ``head tied: True;
buffers: ['final_logits_bias']`` for both fixtures) and the initializers' names and shapes in the files.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from exporters import export
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
HEADS = ROOT / "tests" / "exporters" / "data" / "head_cases"
ZOO = ROOT / "tests" / "zoo"
SEQ2SEQ = {"batch": 2, "seq": 16, "tgt_seq": 12}


def _replicated(path: Path, dims: dict[str, int]):
    graph = load_graph(path, dims)
    return make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))


def _megatron_refusal(path: Path) -> str:
    with pytest.raises(UnsupportedExport) as refused:
        export("megatron", _replicated(path, SEQ2SEQ))
    return refused.value.reason


def _initializers(path: Path) -> dict[str, tuple[int, ...]]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: tuple(t.dims) for t in model.graph.initializer}


@pytest.mark.parametrize("name, matrix", [("pegasus_ts_bare", "onnx::MatMul_935"), ("marian_ts_bare", "onnx::MatMul_905")])
def test_a_torchscript_tied_head_and_its_buffer_are_not_called_untied_and_biased(name, matrix):
    path = HEADS / f"{name}.onnx"
    shapes = _initializers(path)
    assert shapes[matrix] == tuple(reversed(shapes["model.shared.weight"]))  # the word table, transposed
    assert shapes["final_logits_bias"] == (1, 1000)
    reason = _megatron_refusal(path)
    assert "untied vocabulary projection" not in reason
    assert (f"its vocabulary matrix {matrix} may be the word table's transposed copy (TorchScript duplicates a tied "
            "weight) or a head of its own; final_logits_bias, added to the logits, may be a buffer") in reason
    assert "Megatron's T5LMHead is either tied with a learned bias or untied without one" in reason


def test_a_folded_buffer_is_worded_the_same():
    reason = _megatron_refusal(ZOO / "bart_ts_bare.onnx")
    assert "onnx::Add_962, added to the logits, may be a buffer" in reason and "untied vocabulary" not in reason


def test_a_dynamo_tied_head_has_no_bias():
    # torch.export records final_logits_bias as a BUFFER: the head is the tied table with no trained bias
    reason = _megatron_refusal(ZOO / "bart_dynamo_bare.onnx")
    assert "its tied vocabulary projection has no bias and Megatron's tied T5LMHead has one" in reason


def test_the_gpt_export_notes_a_head_that_may_be_the_tied_copy():
    ts, dynamo = ZOO / "gpt2_ts_bare.onnx", ZOO / "gpt2_dynamo_bare.onnx"
    shapes = _initializers(ts)
    copy = next(n for n in shapes if n.startswith("onnx::MatMul_") and shapes[n] == tuple(reversed(shapes["transformer.wte.weight"])))
    document = export("megatron", _replicated(ts, {"batch": 2, "seq": 16}))
    assert "--untie-embeddings-and-output-weights" in document["args"]
    assert any(note.startswith(f"the LM head's weight {copy} is a constant the TorchScript exporter made") and
               "drop --untie-embeddings-and-output-weights" in note for note in document["notes"])
    tied = export("megatron", _replicated(dynamo, {"batch": 2, "seq": 16}))  # dynamo names the tied weight
    assert "--untie-embeddings-and-output-weights" not in tied["args"]
    assert not any("untie" in note for note in tied["notes"])

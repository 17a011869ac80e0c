"""A named ``[1, V]`` tensor added to the logits may be ``final_logits_bias`` (issue 25, task H6, item 3).

BART, Marian and Pegasus register ``final_logits_bias`` ``[1, vocab]`` as a buffer (zeros, never trained) and add it
to the LM head's logits. TorchScript writes a buffer as an initializer like any parameter: BART's folded into an
``onnx::Add_N`` (warned before: "may be a non-trainable buffer"), Marian's and Pegasus' under its own name, which
was counted with no word. A graph-only file cannot tell a buffer from a parameter, so it stays counted, now warned
the same way; a learned ``nn.Linear`` bias is ``[V]`` and the dynamo exporter records buffers (dropped, no warning).

Oracles: torch's ``sum(p.numel() for p in model.parameters())`` of the models ``tests/exporters/make_head_cases.py``
builds (transformers 5.24, seed 0): Pegasus 248,064, Marian 247,808 (the head tied to the shared table, counted
once), and ``counts.json`` for the importer sweep's Marian; each file's initializers (names and shapes) read here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
HEADS = ROOT / "tests" / "exporters" / "data" / "head_cases"
SWEEP = ROOT / "tests" / "data" / "importer_sweep_cases"
SEQ2SEQ = {"batch": 2, "seq": 16, "tgt_seq": 12}
TORCH = {HEADS / "pegasus_ts_bare.onnx": 248_064, HEADS / "marian_ts_bare.onnx": 247_808,
         SWEEP / "marian_ts_bare.onnx": json.loads((SWEEP / "counts.json").read_text())["marian_ts"]["param_count"]}
BUFFER = re.compile(r"^'final_logits_bias' \[1, (\d+)\], a named \[1, N\] tensor added to the output, may be a "
                    r"non-trainable buffer .*; it is counted \(([\d,]+) parameters\)")
TIED = re.compile(r"may be a transposed copy of the tied embedding .* it is counted \(([\d,]+) parameters\)")


def _initializers(path: Path) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(i.dims) for i in onnx.load(str(path), load_external_data=False).graph.initializer}


@pytest.mark.parametrize("path", sorted(TORCH), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_named_logits_bias_is_warned_and_the_rest_is_torchs(path: Path):
    vocab = _initializers(path)["final_logits_bias"][1]
    assert _initializers(path)["final_logits_bias"] == (1, vocab) and vocab == 1000
    graph = load_graph(path, SEQ2SEQ)
    (warning,) = [w for w in graph.warnings if w.startswith("'final_logits_bias'")]
    match = BUFFER.match(warning)
    assert match and int(match.group(1)) == vocab and match.group(2) == f"{vocab:,}" and "\n" not in warning
    tied = sum(int(m.group(1).replace(",", "")) for w in graph.warnings if (m := TIED.search(w)))
    assert tied in (0, 64 * vocab)  # the tied head's TorchScript copy, [d_model, vocab], warned on its own
    assert graph.parameter_count == TORCH[path] + vocab + tied


def test_dynamo_records_the_buffer_so_no_warning():
    path = ROOT / "tests" / "data" / "multi_stack_cases" / "marian_dynamo_bare.onnx"
    assert _initializers(path)["final_logits_bias"] == (1, 1000)
    graph = load_graph(path, SEQ2SEQ)
    assert not any("final_logits_bias" in w for w in graph.warnings)
    assert "final_logits_bias" not in {t.name for t in graph.parameters}


def test_a_learned_head_bias_is_not_warned():
    # the word-level LSTM LM's decoder is an nn.Linear with a [vocab] bias, added to the logits: a parameter
    path = ROOT / "tests" / "data" / "lstm_lm.onnx"
    graph = load_graph(path, {"batch": 2, "seq": 16})
    assert not any("non-trainable buffer" in w for w in graph.warnings)

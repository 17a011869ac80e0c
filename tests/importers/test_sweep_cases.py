"""Readings of four architectures outside the zoo that a new user's sweep found wrong (issue 25, task H6).

Files: ``tests/data/sweep_cases`` (``tests/importers/make_sweep_cases.py``; ``counts.json`` holds torch's
``sum(p.numel() for p in model.parameters())`` and the shapes of the parameters named below).

* Persimmon's ``relu2`` is ``tests/importers/test_squared_relu.py``'s.
* Wav2Vec2's ``[C, 1, K]`` feature-extractor conv is no Mamba mixer (:func:`importers.hybrid.has_mamba_mixer`),
  and the positional conv's weight-norm magnitude, folded by TorchScript, is named in a warning.
* MobileBERT's LM head weight ``cat([decoder.weight.t(), dense.weight], 0)``, folded by TorchScript, holds the
  tied word table: a warning says by how much the count is too high.
* CLIP's root-module ``logit_scale``, folded by dynamo into ``exp``: the warning names it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.hybrid import analyze_hybrid, has_mamba_mixer

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "sweep_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _graph(name: str, **dims: int):
    return import_model(CASES / f"{name}_bare.onnx", dims)


def _shape(case: str, suffix: str) -> list[int]:
    (shape,) = [s for n, s in COUNTS[case]["shapes"].items() if n.endswith(suffix)]
    return shape


def test_wav2vec2_is_not_mamba_and_names_its_folded_weight_norm():
    graph = _graph("wav2vec2_ts", batch=2, samples=16000)
    assert not has_mamba_mixer(graph) and analyze_hybrid(graph) is None
    # torch counts 94,512; the file lacks masked_spec_embed [64] (the forward never reads it without a mask)
    # and the positional conv's weight_norm(dim=2) magnitude g [1, 1, 16], folded into 'onnx::Conv_*'
    g = _shape("wav2vec2_ts", "original0")
    assert g == [1, 1, 16]
    missing = math.prod(_shape("wav2vec2_ts", "masked_spec_embed")) + math.prod(g)
    assert graph.parameter_count == COUNTS["wav2vec2_ts"]["param_count"] - missing == 94_432
    (note,) = [w for w in graph.warnings if "weight norm" in w]
    # v is [hidden 64, hidden / groups 16, kernel 16]: 16,384 counted; g has one element per tap for dim=2
    assert "'wav2vec2.encoder.pos_conv_embed.conv.weight_g'" in note and "(16,384)" in note
    assert "16 elements for weight_norm(dim=2)" in note


@pytest.mark.parametrize("name", ["mamba2_ts_bare", "mamba2_dynamo_bare", "mamba2_ts_consts", "mamba2_dynamo_consts"])
def test_mamba2_mixers_still_read_as_mamba(name):
    graph = import_model(ROOT / "tests" / "data" / "mamba2_cases" / f"{name}.onnx", {"batch": 2, "seq": 64})
    assert has_mamba_mixer(graph)
    assert analyze_hybrid(graph).pattern == "M"  # make_mamba2_cases.py: one Mamba-2 layer


def test_mobilebert_head_concat_of_the_tied_table_is_warned():
    graph = _graph("mobilebert_ts", batch=2, seq=16)
    table = _shape("mobilebert_ts", "word_embeddings.weight")  # [vocab 1000, embedding 64]
    tied = math.prod(table)
    # the count holds the head's [hidden 128, vocab 1000] constant whole: torch's 346,600 + the tied 64,000
    assert graph.parameter_count == COUNTS["mobilebert_ts"]["param_count"] + tied == 410_600
    (note,) = [w for w in graph.warnings if "concatenated" in w]
    assert "[128, 1000] may hold" in note and "'mobilebert.embeddings.word_embeddings.weight' [1000, 64]" in note
    assert f"true count is {tied:,} lower" in note


def test_clip_folded_logit_scale_is_named():
    graph = _graph("clip_dynamo", batch=2, seq=16)
    assert _shape("clip_dynamo", "logit_scale") == []  # a 0-d root-module parameter: 1 element
    assert graph.parameter_count == COUNTS["clip_dynamo"]["param_count"] - 1 == 217_856
    (note,) = [w for w in graph.warnings if "folded_from" in w]
    assert "'exp' from ['logit_scale']" in note and "if 'logit_scale' is a parameter of the root module" in note
    assert "up to 1 higher" in note


def _concat_head(path: Path, *, tied: bool) -> None:
    """tokens -> Gather(``emb.weight`` [12, 4]) -> Concat with a [2, 3, 2] input -> [2, 3, 6] @ ``onnx::MatMul_9``
    [6, 12] -> logits. The head weight is ``cat([emb.weight.T, other], 0)`` when ``tied``, else random."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((12, 4)).astype(np.float32)
    other = rng.standard_normal((2, 12)).astype(np.float32)
    head = np.concatenate([table.T if tied else rng.standard_normal((4, 12)).astype(np.float32), other], 0)
    nodes = [helper.make_node("Gather", ["emb.weight", "ids"], ["e"]),
             helper.make_node("Concat", ["e", "extra"], ["h"], axis=-1),
             helper.make_node("MatMul", ["h", "onnx::MatMul_9"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("ids", T.INT64, [2, 3]), helper.make_tensor_value_info("extra", T.FLOAT, [2, 3, 2])],
        [helper.make_tensor_value_info("logits", T.FLOAT, [2, 3, 12])],
        [numpy_helper.from_array(table, "emb.weight"), numpy_helper.from_array(head, "onnx::MatMul_9")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("tied", [True, False])
def test_concatenated_copy_with_values(tmp_path, tied):
    _concat_head(tmp_path / "m.onnx", tied=tied)
    graph = import_model(tmp_path / "m.onnx", {})
    assert graph.parameter_count == 12 * 4 + 6 * 12  # both counted: 48 + 72
    notes = [w for w in graph.warnings if "concatenated" in w]
    if tied:  # the first 4 rows equal the table transposed: proven, 48 too many
        assert len(notes) == 1 and "[6, 12] holds, in 4 of its rows" in notes[0] and "48 lower" in notes[0]
    else:
        assert notes == []

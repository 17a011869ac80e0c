"""Megatron-LM is not told to train a longer position table than the file's (issue 25, "exact or refused").

A model with a learned position table of ``R`` rows cannot run a sequence longer than ``R`` (its lookup
reads past the table), and ``--max-position-embeddings`` set to the sequence would train another model,
with a longer table. The export used to write ``max(R, seq)`` without a word. The table's rows are read
here from the ONNX initializer itself, not from the planner.
"""

from __future__ import annotations

import onnx
import pytest

from exporters.megatron.families import megatron_family
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from tests.exporters.test_megatron_families import DATA, ROOT

ZOO = ROOT / "tests" / "zoo"


def _table_rows(path, name: str) -> int:
    """Rows of the initializer ``name`` (GPT-2's ``wpe``, BERT's ``position_embeddings``), from the file."""
    model = onnx.load(str(path), load_external_data=False)
    return next(int(t.dims[0]) for t in model.graph.initializer if name in t.name and len(t.dims) == 2)


@pytest.mark.parametrize("path, table, family", [(ZOO / "gpt2_dynamo_consts.onnx", "wpe", "gpt"),
                                                 (DATA / "megatron_bert_tiny.onnx", "position_embeddings", "bert")])
def test_a_sequence_past_the_learned_table_is_refused(path, table, family):
    rows = _table_rows(path, table)
    fits = load_graph(path, {"batch": 4, "seq": rows})
    assert megatron_family(fits, analyze_transformer(fits)).family == family
    longer = load_graph(path, {"batch": 4, "seq": 2 * rows})
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(longer, analyze_transformer(longer))
    assert f"its learned position table has {rows} rows and the sequence is {2 * rows} tokens" in str(refused.value)
    assert f"--dim seq={rows} or less" in str(refused.value)


def test_the_table_length_is_what_megatron_is_told():
    # at the table's own length the flag says the table's rows, as the file holds them
    from tests.exporters.test_megatron_families import _export

    path = ZOO / "gpt2_dynamo_consts.onnx"
    rows = _table_rows(path, "wpe")
    args = _export(load_graph(path, {"batch": 16, "seq": rows}), 2, 2)["args"]
    assert args[args.index("--max-position-embeddings") + 1] == str(rows)
    assert args[args.index("--seq-length") + 1] == str(rows)

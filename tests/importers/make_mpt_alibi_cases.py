"""Build the MPT files of ``tests/importers/test_mpt_alibi_table.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_mpt_alibi_cases.py

The model is transformers' ``MptForCausalLM`` at a small size (``CONFIG``: 2 layers, hidden 64, 8 heads,
``max_seq_len`` 16). MPT builds its ALiBi bias once (``build_mpt_alibi_tensor``: ``[heads, 1, max_seq_len]``)
and adds its last ``keys`` columns to every attention's scores; both exporters fold it to a constant, so
no ``Range`` is left. Each exporter's file is saved graph-only as ``make_param_cases.py`` does: every
initializer external and its data file deleted (``bare``: the dynamo file's table values are gone, the
TorchScript ``Constant`` keeps them), or the constants under 1 KiB inline (``consts``: the 512-byte table
too). ``counts.json`` records the config, torch's parameter count, the slopes torch's
``build_mpt_alibi_tensor`` gives (``slopes``: per head, the bias's step per key position) and whether
torch runs the model one token past ``max_seq_len`` (``runs_past_table``: it does not).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "mpt_alibi_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _Logits, _randomise  # noqa: E402
from make_zoo import save_graph_only  # noqa: E402

CONFIG = dict(n_layers=2, d_model=64, n_heads=8, expansion_ratio=2, vocab_size=96, max_seq_len=16, use_cache=False)
"""``MptConfig`` fields of the small model (``MptConfig`` defaults: ALiBi on, no linear biases)."""

SEQ = 8
"""The traced sequence (the dynamo export's ``seq`` runs 2 to ``max_seq_len``)."""


def _export(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, int]:
    """Both exporters, graph-only; file name -> torch's parameter count."""
    count = sum(p.numel() for p in model.parameters())
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=CONFIG["max_seq_len"])}
    with torch.no_grad():
        program = torch.onnx.export(model, (ids,), dynamo=True, opset_version=18, optimize=True, dynamic_shapes=(dims,))
    protos = {"dynamo": program.model_proto}
    path = OUT / "mpt_ts_full.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (ids,), str(path), dynamo=False, opset_version=17, do_constant_folding=True,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})
    import onnx

    protos["ts"] = onnx.load(str(path))
    path.unlink()
    counts = {}
    for exporter, proto in protos.items():
        for style, threshold in (("bare", 0), ("consts", 1024)):
            save_graph_only(proto, OUT / f"mpt_{exporter}_{style}.onnx", threshold_bytes=threshold)
            counts[f"mpt_{exporter}_{style}.onnx"] = count
    return counts


def _runs(model: torch.nn.Module, seq: int) -> bool:
    """Whether torch runs ``model`` on one sequence of ``seq`` tokens."""
    try:
        with torch.no_grad():
            model(torch.zeros(1, seq, dtype=torch.long))
    except RuntimeError:  # the [heads, 1, max_seq_len] bias does not broadcast over more keys
        return False
    return True


def main() -> int:
    import transformers
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = _randomise(_Logits(transformers.MptForCausalLM(transformers.MptConfig(**CONFIG))))
    ids = torch.randint(0, CONFIG["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(SEED))
    files = _export(model, ids)
    table = build_mpt_alibi_tensor(CONFIG["n_heads"], CONFIG["max_seq_len"])  # [heads, 1, max_seq_len]
    steps = table[:, 0, 1:] - table[:, 0, :-1]
    record = {
        "config": CONFIG, "files": files, "table_shape": list(table.shape),
        "slopes": [float(s) for s in steps[:, 0]],
        "runs_at_table": _runs(model, CONFIG["max_seq_len"]),
        "runs_past_table": _runs(model, CONFIG["max_seq_len"] + 1),
    }
    (OUT / "counts.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

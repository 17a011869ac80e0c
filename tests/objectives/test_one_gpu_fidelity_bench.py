"""bench/one_gpu_fidelity.py: rows are priced under their mode's execution model, errors are
(predicted - measured) / measured, and fit / held-out rows are split by model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("one_gpu_fidelity", ROOT / "bench" / "one_gpu_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_modes_map_to_execution_models(bench):
    assert bench.MODES == {
        "eager": ("eager", "explicit"),
        "sdpa": ("eager", "flash"),
        "sdpa-compile": ("fused", "flash"),
        "eager-compile": ("fused", "explicit"),
    }
    assert "llama" not in bench.FIT_MODELS and "bert" not in bench.FIT_MODELS  # held out


def test_scores_rows_and_prints_the_table(bench, tmp_path, capsys):
    rows = [
        {"model": "mlp", "batch": 256, "seq": None, "mode": "eager", "step_s": 0.003, "peak_alloc_bytes": 5 * 10**8},
        {"model": "mlp", "batch": 256, "seq": None, "mode": "sdpa-compile", "step_s": 0.002,
         "peak_alloc_bytes": 4 * 10**8},
    ]
    scored = bench.score(rows)
    for row in scored:
        assert row["step_err"] == pytest.approx((row["pred_step_s"] - row["step_s"]) / row["step_s"])
        assert row["mem_err"] == pytest.approx((row["pred_peak_bytes"] - row["peak_alloc_bytes"]) / row["peak_alloc_bytes"])
    # eager launches more kernels than fused for the same graph: never faster
    assert scored[0]["pred_step_s"] >= scored[1]["pred_step_s"]
    data = tmp_path / "steps.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert bench.main(["--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "| mlp | 256 | eager | fit |" in out
    assert "| eager | fit | 1 |" in out

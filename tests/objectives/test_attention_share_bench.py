"""bench/attention_share.py's arithmetic, by hand: the attention factor that meets a measured step, and the
per-model scale of the rest of the prediction read off the row with the smallest attention share."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "attention_share.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attention_share", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    return module


def _split(bench, id, model, measured, attention, rest):
    parts = {"attention": attention, "matmul": rest, "other": 0.0, "comm": 0.0, "tail": 0.0}
    return bench.Split(id=id, model=model, measured_s=measured, predicted_s=attention + rest, parts=parts)


def test_the_factor_that_meets_the_measured_step(bench):
    # torchtitan's cp 8 row as priced at c17b036: measured 59.796 s, attention 32.818 s, the rest 2.539 s:
    # (59.796 - 2.539) / 32.818 = 57.257 / 32.818
    assert bench.implied_attention_factor(59.796, 32.818, 2.539) == pytest.approx(57.257 / 32.818, rel=1e-12)
    # the rest scaled by 1.25 first: (59.796 - 3.17375) / 32.818
    assert bench.implied_attention_factor(59.796, 32.818, 2.539, 1.25) == pytest.approx(56.62225 / 32.818, rel=1e-12)
    assert math.isnan(bench.implied_attention_factor(1.0, 0.0, 1.0))


def test_each_model_is_scaled_by_its_smallest_attention_share(bench):
    splits = [
        _split(bench, "m-32k", "m", measured=4.0, attention=1.8, rest=0.7),    # share 0.72
        _split(bench, "m-512", "m", measured=1.2, attention=0.1, rest=1.0),    # share 0.0909: the reference
        _split(bench, "m-2k", "m", measured=1.5, attention=0.2, rest=1.0),     # share 0.1667
        _split(bench, "n-8k", "n", measured=3.0, attention=1.0, rest=1.0),     # n's only row
    ]
    scales = bench.reference_scales(splits)
    assert scales["m"] == pytest.approx((1.2 - 0.1) / 1.0, rel=1e-12)
    assert scales["n"] == pytest.approx((3.0 - 1.0) / 1.0, rel=1e-12)
    # the 32k row then asks (4.0 - 1.1 x 0.7) / 1.8 = 3.23 / 1.8 of its attention
    assert bench.implied_attention_factor(4.0, 1.8, 0.7, scales["m"]) == pytest.approx(3.23 / 1.8, rel=1e-12)


def test_the_table_prints_every_row(bench):
    lines = bench._table([_split(bench, "m-512", "m", measured=1.2, attention=0.1, rest=1.0)])
    assert len(lines) == 2 and lines[1].startswith("m-512")
    # its own reference: scaled factor (1.2 - 1.1 x 1.0) / 0.1 = 1.00; unscaled (1.2 - 1.0) / 0.1 = 2.00
    assert lines[1].split()[-2:] == ["2.00", "1.00"]

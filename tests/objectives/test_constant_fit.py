"""Tests of bench/constant_fit.py's pure parts (no row is priced): the fit's starting cluster and the
residual trends, each expected number worked out by hand in the comments."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from objectives.calibration import calibratable_parameters
from objectives.cluster import make_cluster
from planner.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def constant_fit():
    spec = importlib.util.spec_from_file_location("bench_constant_fit", REPO / "bench" / "constant_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_unfitted_preset_starts_at_the_family_figure(constant_fit):
    # h100-sxm-96gb-500w carries no matmul_efficiency (priced at FAMILY_EFFICIENCY's 0.70, the cuBLAS /
    # Megatron MFU figure): without a value the field is not calibratable, so the fit starts at 0.70
    cluster = make_cluster("h100-sxm-96gb-500w", devices=8)
    assert cluster.device.matmul_efficiency is None
    with pytest.raises(InputError, match="not a calibratable field"):
        calibratable_parameters(cluster, ["device.matmul_efficiency"])
    start = constant_fit.starting_cluster(cluster)
    assert start.device.matmul_efficiency == 0.70
    assert [p.name for p in calibratable_parameters(start, ["device.matmul_efficiency"])] == ["device.matmul_efficiency"]


def test_a_fitted_preset_starts_from_its_own_value(constant_fit):
    # h100-sxm's value is the MPT fit rows' (its comment in objectives/cluster.py names them): kept as given
    cluster = make_cluster("h100-sxm", devices=8)
    assert constant_fit.starting_cluster(cluster) is cluster


def test_trends_are_points_per_doubling_by_hand(constant_fit):
    def row(seq, gpus):
        return SimpleNamespace(model={"seq": seq}, devices=gpus)

    # at 8 GPUs (the most common count): -2 / -7 / -12% at 512 / 1,024 / 2,048 tokens fall 5 points per
    # doubling; at 2,048 tokens (the most common sequence): -12% at 8 GPUs, -4% at 32 (two doublings):
    # +8 / 2 = +4 points per doubling
    rows = [row(512, 8), row(1024, 8), row(2048, 8), row(2048, 32)]
    slopes = constant_fit.trends(rows, [-2.0, -7.0, -12.0, -4.0])
    assert slopes["per_doubling_seq_at_8_gpus"] == pytest.approx(-5.0)
    assert slopes["per_doubling_gpus_at_seq_2048"] == pytest.approx(4.0)

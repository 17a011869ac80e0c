"""A fidelity row's ``layout.hsdp`` (hybrid sharding: FSDP's ``HYBRID_SHARD``, FSDP2's ``dp_shard``) reaches the
pricing as ``TrainingSettings.dp_shard``; a row without it shards over every data-parallel rank.

Oracle: the row's own field, and plain ZeRO-3 over as many ranks as the shard group: gpt2_tiny on 8 A100s at dp 8
with its states sharded over 4 ranks holds per device the states of the plain ZeRO-3 plan on 4 A100s at dp 4.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.calibration import parse_step_rows
from objectives.cluster import make_cluster
from planner.calibrate import row_settings
from planner.core.errors import InputError
from planner.estimate import estimate
from planner.pipeline import graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"


def _record(**layout):
    return {"id": "r", "model": {"kind": "onnx", "path": str(TINY)}, "gpus": {"device": "a100-80gb", "count": 8},
            "layout": {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero": 3, **layout},
            "measured": {"conversion": "step_s", "step_s": 1.0}}


def test_the_field_reaches_the_settings():
    hybrid, plain = parse_step_rows([_record(hsdp=4), _record()])
    assert (hybrid.hsdp, plain.hsdp) == (4, None)
    assert (row_settings(hybrid).dp_shard, row_settings(plain).dp_shard) == (4, None)
    with pytest.raises(InputError, match="hsdp"):
        parse_step_rows([_record(hsdp=0)])
    for shard in (3, 16):  # not a divisor of dp 8: no HYBRID_SHARD layout (was priced silently over gcd(8, hsdp))
        with pytest.raises(InputError, match=f"layout.hsdp {shard} must divide layout.dp 8"):
            parse_step_rows([_record(hsdp=shard)])


def test_states_sharded_over_the_shard_group():
    loader = graph_loader(TINY, {"seq": 128})
    cluster = make_cluster("a100-80gb", devices=8)
    hybrid, plain = (row_settings(r) for r in parse_step_rows([_record(hsdp=4), _record()]))
    over4, over8 = (estimate(loader, cluster=cluster, tp=1, pp=1, micro_batch=1, global_batch=8, zero=3, settings=s)
                    for s in (hybrid, plain))
    four = estimate(loader, cluster=make_cluster("a100-80gb", devices=4), tp=1, pp=1, micro_batch=2, global_batch=8,
                    zero=3, settings=plain)
    assert over4.valid and over8.valid and four.valid
    assert over4.memory.optimizer_bytes == pytest.approx(four.memory.optimizer_bytes, rel=1e-12)
    assert over4.memory.optimizer_bytes > 1.5 * over8.memory.optimizer_bytes

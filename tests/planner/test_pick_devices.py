"""The pick's device count is the devices a row's plan runs on, not its FLOP-dominant degrees (issue 25, h24e).

Planning transformers' GPT-OSS (2 layers, hidden 64, 4 experts; ``planner plan gpt_oss.onnx -n 8 --dim batch=16
--dim seq=256``) picked a Mesh-TF row laid out ``m:8 vocab:m``: the embedding and LM head split 8 ways over the
vocabulary, every other op replicated. Its degrees, read off the ops of the most FLOPs (76% replicated), were
``1 device``, so the tie rule (fewest devices first) chose it over an as-fast ``dp=2`` row, and the note said
``#1 runs on 1 of the 8 devices``. Its generic plan's ``mesh.devices_used`` was 8, as the layout says.
"""

from __future__ import annotations

from types import SimpleNamespace

from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.degrees import Degrees
from planner.core.graph import IterDim, Op
from planner.pick import pick_note, row_devices, tie_pick

OPTIONS = ConfigOptions(devices=8, devices_per_node=8)
# the two ops of a tiny LM: a block's matmul [tokens 16, hidden 64] and the LM head [tokens 16, vocab 1000]
BLOCK = Op(name="mlp", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=3.0,
           dims=(IterDim(name="b", size=16, is_batch=True), IterDim(name="n", size=64)))
HEAD = Op(name="lm_head", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0,
          dims=(IterDim(name="b", size=16, is_batch=True), IterDim(name="v", size=1000)))
SPACES = [enumerate_configs(BLOCK, OPTIONS), enumerate_configs(HEAD, OPTIONS)]


def _row(time_s: float, degrees: Degrees, block: dict[str, int], head: dict[str, int], pp: int = 1):
    choice = [SPACES[0].index_of(block), SPACES[1].index_of(head)]
    point = SimpleNamespace(pp=pp, graph=object(), spaces=SPACES, choice=choice)
    return SimpleNamespace(time_s=time_s, memory_bytes=1e6, fits=True, degrees=degrees, point=point,
                           layout=" x ".join(f"{k}={v}" for k, v in head.items()))


# the vocabulary-only layout: the block whole (1 device), the head over 8 (degrees by FLOPs: 1 device)
VOCAB = _row(1.0, Degrees(), {}, {"v": 8})
DP2 = _row(1.00001, Degrees(dp=2), {"b": 2}, {"b": 2})  # within PICK_TIE (1e-4) of VOCAB


def test_a_vocabulary_split_runs_on_its_mesh():
    assert VOCAB.degrees.devices == 1
    assert row_devices(VOCAB) == 8  # the head's split: 8 ways
    assert row_devices(DP2) == 2
    # two stages of the vocabulary layout, each on 4 devices: 8
    assert row_devices(_row(1.0, Degrees(pp=2), {}, {"v": 4}, pp=2)) == 8


def test_the_tie_takes_the_row_on_fewer_devices():
    rows = [VOCAB, DP2]
    assert tie_pick(rows, 0) == 1  # dp=2 (2 devices) before the vocabulary layout (8)
    note = pick_note(rows, 1, 0, 8)
    assert note.endswith("#2 runs on 2 of the 8 devices, as fast as #1 on more")  # before: #1 picked, "on 1"
    assert "than #1 (v=8, 8 devices, " in note  # its layout and devices, not its FLOP-dominant "1 device"


def test_the_row_summary_names_the_devices_the_pick_names():
    """The row's summary (the ``--json`` rows' ``summary``, the ``row N: ...`` lines of refusals) read ``1 device``
    for the vocabulary layout, as its degrees do, while the pick's note said 8 devices (h25c, issue 25 item 4); it
    now says what the row uses, as the note does. A row whose degrees cover its ops keeps its degrees."""
    from planner.launchable import Row
    from planner.pick import row_label

    def summary(row):
        point = SimpleNamespace(**vars(row.point), micro_batch=16, micro_batches=1, zero_stage=0, recompute="none")
        cache = SimpleNamespace(settings=SimpleNamespace(dp_shard=None, hpz_partition=None, reshard_after_forward="default",
                                                        offload="none"))
        return Row.summary.fget(SimpleNamespace(degrees=row.degrees, point=point, layout=row.layout, cache=cache,
                                                offload="none"))

    assert row_label(VOCAB) == "v=8, 8 devices"
    assert summary(VOCAB) == "v=8, 8 devices, mb=16 x 1, ZeRO-0"  # before: "1 device, mb=16 x 1, ZeRO-0"
    assert summary(DP2) == "dp=2, mb=16 x 1, ZeRO-0"

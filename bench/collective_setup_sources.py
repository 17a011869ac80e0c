"""What the cited nccl-tests figures leave for ``Device.collective_overhead_s``: each whole small all-reduce as
measured, less this model's own price of the same call with no setup (microseconds).

Inside a node the model prices a collective as NCCL's tuner does (:func:`objectives.fixed_costs.nccl_collective_time_s`:
``baseLat + hops x hwLat + bytes / bandwidth`` of the cheapest algorithm and protocol); across nodes by the
alpha-beta ring or tree (:func:`objectives.collectives.all_reduce_time_s`). What the measured time leaves over
that is what a per-call setup could be in nccl-tests' loop: ``iters`` calls timed together with the ranks in
step and no PyTorch (NVIDIA/nccl-tests ``src/common.cu``, ``BenchTime``), so a lower bound of the setup a
training step pays, not a fit of it (docs/VALIDATION.md, "``collective_overhead_s``: the fit")::

    .venv/bin/python bench/collective_setup_sources.py

The rows (message size, ranks, measured us, the link the model prices it on):

* NVIDIA/nccl#583: 32 B all-reduce on 2 A100-SXM4-40GB, 10.14 us (NVLink 3: ``nvlink3``).
* NVIDIA/nccl#1984: 1 KB ring all-reduce on 4 H800 without CUDA graphs, 3.5 us (NVLink 4: ``nvlink4``).
* NVIDIA/nccl-tests#150: 8 B all-reduce between two A100 nodes, one GPU each, HDR InfiniBand, 19.90 us
  (``ib-hdr``, one device per node).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class SourceCall:
    """One cited measurement of a whole all-reduce call."""

    source: str
    num_bytes: int
    devices_per_node: int
    nodes: int
    measured_us: float
    intra_link: str
    inter_link: str = "ib-hdr"


SOURCES: tuple[SourceCall, ...] = (
    SourceCall("NVIDIA/nccl#583 (2 A100-SXM4-40GB)", 32, 2, 1, 10.14, "nvlink3"),
    SourceCall("NVIDIA/nccl#1984 (4 H800, no CUDA graph)", 1024, 4, 1, 3.5, "nvlink4"),
    SourceCall("NVIDIA/nccl-tests#150 (2 A100 nodes, HDR IB)", 8, 1, 2, 19.90, "nvlink3"),
)


def model_us(call: SourceCall) -> float:
    """This model's price of ``call`` with no setup (microseconds): NCCL's tuner in a node, alpha-beta across.

    >>> round(model_us(SOURCES[0]), 2)  # ring LL on 2 ranks: baseLat 3.6 + 2 hops x 0.47 us (32 B: +0.0006 us)
    4.54
    >>> round(model_us(SOURCES[2]), 2)  # ring over 2 nodes: 2 (n - 1) = 2 latencies of ib-hdr's 5 us
    10.0
    """
    from objectives.cluster import LINK_PRESETS
    from objectives.collectives import all_reduce_time_s
    from objectives.fixed_costs import nccl_collective_time_s

    intra, inter = LINK_PRESETS[call.intra_link], LINK_PRESETS[call.inter_link]
    if call.nodes == 1:
        return float(nccl_collective_time_s("all_reduce", call.num_bytes, call.devices_per_node, intra)) * 1e6
    return float(all_reduce_time_s(call.num_bytes, intra_size=call.devices_per_node, inter_size=call.nodes,
                                   intra_link=intra, inter_link=inter)) * 1e6


def main() -> int:
    for call in SOURCES:
        priced = model_us(call)
        print(f"{call.source}: {call.num_bytes} B, measured {call.measured_us:.2f} us, model without setup "
              f"{priced:.2f} us, left for the setup {call.measured_us - priced:+.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

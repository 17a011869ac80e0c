r"""Whether a FLOP-efficiency constant can move a price: the efficiency under which an op's FLOP term would
exceed its memory term, over the ops and configurations of the fit rows' models.

:func:`objectives.compute.roofline_time_s` prices a pass as the longer of :math:`F / (\pi\,\eta)` and
:math:`B / (bw\,\eta_{mem})`. For a family whose ops stream far more bytes than they compute, the FLOP term
is the longer only when :math:`\eta` is below

.. math:: \eta^{*} = \frac{F}{B} \cdot \frac{bw\,\eta_{mem}}{\pi}

(``F``: the shard's forward FLOPs, ``B``: its forward bytes, :func:`objectives.compute.forward_bytes`;
``pi``: the device's dense peak for the row's precision; the backward's ratio is
``backward_flops_factor / BACKWARD_BYTES_FACTOR`` times this). Every configuration of every op of the
family, in every fit row's model on that row's device (:func:`planner.core.configs.enumerate_configs` at the
row's GPU count, at most two split dims), is visited; the largest :math:`\eta^{*}` per family is printed. A
constant above that largest :math:`\eta^{*}` gives the same price as any other value above it: no fit row can
measure it, and it moves no price of those rows.

Used for issue 23 (docs/VALIDATION.md, "Constants' sources and fits"): ``DEFAULT_EFFICIENCY`` (the families
outside ``FAMILY_EFFICIENCY``) and ``FAMILY_EFFICIENCY``'s embedding / gather, whose ops carry no FLOPs::

    .venv/bin/python bench/efficiency_reach.py                # the bench/fidelity fit rows
    .venv/bin/python bench/efficiency_reach.py --a100-node    # the A100 node's fit rows (12 and 20 layers)

Only the rows' ``split: fit`` side is read; GPT models come from ``.cache/fidelity`` (rows whose model is not
built are skipped and counted).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

SKIPPED_KINDS = frozenset({"matmul", "conv", "rnn"})
"""Families whose FLOP term can be the longer one (products, convolutions, recurrent cells): not visited."""


def family_thresholds(graph, *, cluster, settings, max_split_dims: int = 2) -> dict[str, float]:
    """Largest :math:`\\eta^*` (module docstring) per op family of ``graph``, over every op outside
    :data:`SKIPPED_KINDS` and every configuration on ``cluster``'s devices."""
    from objectives.compute import MEMORY_BANDWIDTH_EFFICIENCY, compute_dtype, forward_bytes, peak_flops_per_s
    from planner.core.configs import ConfigOptions, enumerate_configs

    device = cluster.device
    peak = peak_flops_per_s(device, compute_dtype(settings))
    stream = device.memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY
    options = ConfigOptions(devices=cluster.devices, devices_per_node=cluster.devices_per_node,
                            max_split_dims=max_split_dims)
    tensors = graph.tensors
    worst: dict[str, float] = defaultdict(float)
    for op in graph.ops:
        if op.kind in SKIPPED_KINDS:
            continue
        space = enumerate_configs(op, options)
        flops = op.flops / space.devices_used.astype(np.float64)
        moved = forward_bytes(op, space, tensors=tensors, settings=settings)
        ratio = np.divide(flops, moved, out=np.zeros_like(flops), where=moved > 0)
        worst[op.kind] = max(worst[op.kind], float(ratio.max(initial=0.0)) * stream / peak)
    return dict(worst)


def main(argv=None) -> int:
    from fidelity import A100_NODE, DATA, _with_files, gpt_file, load_rows, BUILT_KINDS
    from planner.calibrate import default_graph_for, row_cluster, row_settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a100-node", action="store_true", help="the A100 node's fit rows instead of runs_*.jsonl")
    args = parser.parse_args(argv)
    paths = [A100_NODE] if args.a100_node else sorted(DATA.glob("runs_*.jsonl"))
    rows = [r for r in load_rows(paths) if r.split == "fit"]
    built = [r for r in rows if r.model.get("kind") not in BUILT_KINDS or gpt_file(r.model).exists()]
    graph_for = default_graph_for()
    worst: dict[str, tuple[float, str]] = {}
    seen: set[tuple] = set()
    for row in _with_files(built):
        key = (row.model.get("path"), tuple(sorted((row.model.get("dims") or {}).items())), row.micro_batch,
               row.device, row.devices, row.devices_per_node)
        if key in seen:
            continue
        seen.add(key)
        found = family_thresholds(graph_for(row)(row.micro_batch), cluster=row_cluster(row), settings=row_settings(row))
        for kind, value in found.items():
            if value >= worst.get(kind, (-1.0, ""))[0]:
                worst[kind] = (value, row.id)
    print(f"{len(rows)} fit rows, {len(built)} with a model, {len(seen)} distinct (model, micro-batch, cluster) visited")
    print("family        largest eta* (a FLOP efficiency above it moves no price)   row")
    for kind, (value, row_id) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:<13} {value:.2e}   {row_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

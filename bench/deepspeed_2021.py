"""What DeepSpeed's ZeRO-3 of spring 2021 adds to Narayanan et al.'s Table 2 ZeRO-3 rows: a diagnostic of issue 23
(docs/VALIDATION.md, "The PTD-P paper's ZeRO-3 rows: what the DeepSpeed of 2021 adds"). Nothing here changes a price.

The rows are priced as DeepSpeed 0.19.8 runs ZeRO-3 (``objectives/deepspeed_zero3.py``). The paper ran the DeepSpeed
of April 2021 (v0.3.x, ZeRO-3's first releases). Its ``deepspeed/runtime/zero/stage3.py``,
``partition_parameters.py`` and ``constants.py`` differ where it matters here:

* ``overlap_comm`` defaults to False (``ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT``), so ``reduction_stream`` is the
  compute stream. ``average_tensor`` -> ``_reduce_scatter_gradients`` issues one ``reduce_scatter`` *per parameter*
  and waits on each handle, so the gradients' reduce-scatter is on the critical path. Biases and norms
  (``stage3_param_persistence_threshold``) also get one call each; 0.19.8 coalesces them into its bucket.
* Every collective loops over the ranks in Python: ``_allgather_param`` (each fetch and prefetch) builds ``n``
  ``narrow`` views and calls ``get_rank`` on each iteration; ``_reduce_scatter_gradient`` builds ``n`` views of the
  gradient. Both hand PyTorch's *list* collectives ``n`` tensors, and ``ProcessGroupNCCL`` copies each of them
  through a flat buffer (``flatten_for_scatter_gather``: ``n`` copies per call).
* ``backward`` -> ``_partition_all_parameters`` releases every parameter, the persistent ones too.
  ``_post_step`` gathers those back with ``_allgather_params``, which copies each one out rank by rank: one
  ``narrow``/``view``/``narrow``/``copy_`` per rank holding a piece of it. For a 12,288-element bias on 1,536
  ranks that is 1,536 iterations, for each of the ~770 biases and norms, every step.
* ``fetch_sub_module`` -> ``_synchronize_communication`` calls ``torch.cuda.synchronize()`` whenever a module
  has anything to gather or in flight, so the host loops run while the GPU is idle.

This script prices each row at HEAD, then with the reduce-scatter not overlapped (``overlap=False`` for the
reduce-scatter terms of :func:`objectives.deepspeed_zero3.deepspeed_zero3_sync_s`), then with nothing overlapped.
To each it adds the host loops, counted from the model's shapes, and the persistent parameters' one-per-parameter
reduce-scatters, priced by the repo's own collective model (:func:`objectives.intra_op.term_time_s`). The host
seconds per loop iteration are measured by ``--measure`` on the machine at hand, with ``torch`` on CPU tensors:
a lower bound for the CUDA run of 2021 (no ``cudaLaunchKernel``, a newer dispatcher)::

    .venv-integration/bin/python bench/deepspeed_2021.py --measure   # seconds per iteration (torch needed)
    .venv/bin/python bench/deepspeed_2021.py                          # the six rows, about 2 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS = Path(__file__).resolve().parent / "fidelity" / "runs_megatron.jsonl"
PERSISTENCE_THRESHOLD = 1e5
"""``stage3_param_persistence_threshold``'s default (DeepSpeed 0.3.x ``FP16_DeepSpeedZeroOptimizer_Stage3``)."""


@dataclass(frozen=True)
class LoopCosts:
    """Host seconds of one iteration of each per-rank loop (the ``--measure`` figures, 2026-12-02, h29e)."""

    gather_view_s: float = 2.49e-6
    """``_allgather_param``: one ``narrow`` and one ``get_rank(group)`` (s)."""
    scatter_view_s: float = 2.71e-6
    """``_reduce_scatter_gradient``: one ``view`` and one ``narrow`` (s)."""
    list_copy_s: float = 2.40e-6
    """``ProcessGroupNCCL``'s copy of one list entry through the flat buffer (a ``copy_``) (s)."""
    persistent_copy_s: float = 5.97e-6
    """``_allgather_params``: ``narrow``, ``view``, ``narrow`` and ``copy_`` of one rank's piece (s)."""


@dataclass(frozen=True)
class Counts:
    """Per step (one micro-batch) of a GPT of ``layers`` x ``hidden`` on ``ranks`` ZeRO-3 ranks."""

    gathers: int
    """Weights all-gathered (``_allgather_param`` calls)."""
    reduce_scatters: int
    """Gradients reduce-scattered, one call each (every parameter)."""
    persistent: tuple[int, ...]
    """Elements of each persistent parameter (under the threshold: biases and norms)."""
    persistent_iterations: int
    """Iterations of ``_allgather_params``'s copy loop over them."""


def ranks_holding(elements: int, ranks: int) -> int:
    """Ranks whose piece of a parameter of ``elements`` holds any of it (``i * ceil(elements / ranks) < elements``).

    >>> ranks_holding(12288, 1536), ranks_holding(20480, 1120), ranks_holding(20480, 2240)
    (1536, 1078, 2048)
    """
    piece = math.ceil(elements / ranks)
    return min(ranks, math.ceil(elements / piece))


def gpt_counts(layers: int, hidden: int, ranks: int, *, reuse_distance: float = 1e9) -> Counts:
    """The loop counts of one step: each block's four weights (QKV, attention output, the MLP's two) gathered in
    the forward, again in the recomputed forward, and in the backward unless the block's weights after them are
    under half the reuse distance (:func:`objectives.deepspeed_zero3.gathers_per_micro_batch`'s rule), plus the
    word and position embeddings and the tied head (forward and backward: 6); twelve parameters per block plus
    the embeddings and the final norm each reduce-scattered; biases and norms under the threshold persistent.

    By hand at 174.6B on 1,536 ranks: 96 x (3 + 3 + 3 + 2) + 6 gathers (the second MLP weight is 0 elements from the
    block's end: not gathered again), 12 x 96 + 4 reduce-scatters, 8 x 96 + 2 persistent, each held by all 1,536
    ranks (8 elements of a 12,288-element bias each):

    >>> c = gpt_counts(96, 12288, 1536)
    >>> c.gathers, c.reduce_scatters, len(c.persistent), c.persistent_iterations
    (1062, 1156, 770, 1182720)
    """
    h = hidden
    weights = (3 * h * h, h * h, 4 * h * h, 4 * h * h)
    after = [sum(weights[i + 1:]) for i in range(len(weights))]
    per_block = sum(2 + (1 if 2 * a >= reuse_distance else 0) for a in after)
    block_small = (h, h, 3 * h, h, h, h, 4 * h, h)  # two norms' weight and bias, the four linear layers' biases
    persistent = tuple(m for m in block_small if m < PERSISTENCE_THRESHOLD) * layers + (h, h)
    return Counts(gathers=layers * per_block + 6, reduce_scatters=12 * layers + 4, persistent=persistent,
                  persistent_iterations=sum(ranks_holding(m, ranks) for m in persistent))


def host_loop_s(counts: Counts, ranks: int, costs: LoopCosts) -> float:
    """Host seconds per step of the per-rank loops (module docstring), none of them hidden.

    >>> round(host_loop_s(Counts(gathers=2, reduce_scatters=3, persistent=(), persistent_iterations=10), 100,
    ...                   LoopCosts(1e-6, 2e-6, 3e-6, 4e-6)), 9)  # 2*100*(1+3) + 3*100*(2+3) + 10*4 us
    0.00234
    """
    return (counts.gathers * ranks * (costs.gather_view_s + costs.list_copy_s)
            + counts.reduce_scatters * ranks * (costs.scatter_view_s + costs.list_copy_s)
            + counts.persistent_iterations * costs.persistent_copy_s)


def persistent_reduce_scatter_s(counts: Counts, ranks: int, cluster, per_node: int) -> float:
    """Seconds per step of one fp16 reduce-scatter per persistent parameter over all ``ranks``, by the repo's
    collective model."""
    import numpy as np

    from objectives.intra_op import CommTerm, term_time_s

    total = 0.0
    for elements in counts.persistent:
        term = CommTerm(kind="grad_sync", collective="reduce_scatter", tensor="persistent",
                        num_bytes=np.array([2.0 * elements]), intra_size=np.array([per_node]),
                        inter_size=np.array([ranks // per_node]))
        total += float(term_time_s(term, cluster=cluster)[0])
    return total


@contextlib.contextmanager
def zero3_overlap(*, gathers: bool, reduce_scatters: bool):
    """Price DeepSpeed's ZeRO-3 terms with the gathers' and the reduce-scatters' overlap switched as given."""
    import objectives.deepspeed_zero3 as dz

    original = dz.deepspeed_zero3_sync_s

    def switched(terms, **kw):
        parts = ([t for t in terms if t.collective == "all_gather"], gathers), \
                ([t for t in terms if t.collective != "all_gather"], reduce_scatters)
        priced = [original(chosen, **{**kw, "overlap": kw.get("overlap", True) and keep}) for chosen, keep in parts]
        return tuple(a + b for a, b in zip(*priced))

    dz.deepspeed_zero3_sync_s = switched
    try:
        yield
    finally:
        dz.deepspeed_zero3_sync_s = original


def row_step_s(row, graph_for) -> float:
    """The planner's step time of a fidelity row, as bench/fidelity.py builds it."""
    from objectives.pipeline_cost import PipelineCostCache
    from planner.calibrate import row_cluster, row_settings
    from planner.estimate import estimate

    cluster, settings = row_cluster(row), row_settings(row)
    cache = PipelineCostCache(graph_for(row), cluster=cluster, settings=settings)
    return estimate(cache, cluster=cluster, tp=row.tp, pp=row.pp, dp=row.dp, cp=row.cp, micro_batch=row.micro_batch,
                    global_batch=row.global_batch, zero=row.zero, recompute=row.recompute,
                    sequence_parallel=row.sequence_parallel, schedule=row.schedule, chunks=row.chunks,
                    stage_layers=row.stage_layers, settings=settings).time_s


def report_row(row, graph_for, costs: LoopCosts) -> None:
    """Print one row's prices: HEAD, reduce-scatter exposed, nothing overlapped; each with the 2021 terms added."""
    from planner.calibrate import row_cluster

    cluster = row_cluster(row)
    counts = gpt_counts(int(row.model["layers"]), int(row.model["hidden"]), row.dp)
    extra = host_loop_s(counts, row.dp, costs) + persistent_reduce_scatter_s(
        counts, row.dp, cluster, cluster.devices_per_node)
    prices = {"HEAD (DeepSpeed 0.19.8's rule)": row_step_s(row, graph_for)}
    with zero3_overlap(gathers=True, reduce_scatters=False):
        prices["reduce-scatter on the critical path"] = row_step_s(row, graph_for)
    with zero3_overlap(gathers=False, reduce_scatters=False):
        prices["nothing overlapped"] = row_step_s(row, graph_for)
    print(f"{row.id}: measured {row.step_s:.2f} s; {counts.gathers} gathers, {counts.reduce_scatters} reduce-scatters"
          f" ({len(counts.persistent)} persistent), {counts.persistent_iterations} persistent copy iterations;"
          f" 2021 terms {extra:.2f} s")
    for name, seconds in prices.items():
        plus = "" if name.startswith("HEAD") else f"   + 2021 terms {seconds + extra:8.2f} s " \
                                                   f"({100 * ((seconds + extra) / row.step_s - 1):+6.1f}%)"
        print(f"    {name:38s} {seconds:8.2f} s ({100 * (seconds / row.step_s - 1):+6.1f}%){plus}")
    sys.stdout.flush()


def measure(chunk: int = 64, repeats: int = 2000) -> LoopCosts:
    """Host seconds per iteration of each loop on CPU tensors (min over ``repeats`` chunks of ``chunk``
    iterations: robust to a shared machine's load). Needs ``torch``."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    flat, out, grad = (torch.empty(8 * chunk, dtype=torch.half) for _ in range(3))
    parts = [flat.narrow(0, 8 * i, 8) for i in range(chunk)]
    loops = {
        "gather_view_s": lambda i: (flat.narrow(0, 8 * i, 8), i == dist.get_rank(group=dist.group.WORLD)),
        "scatter_view_s": lambda i: grad.view(-1).narrow(0, 8 * i, 8),
        "list_copy_s": lambda i: out[8 * i: 8 * i + 8].copy_(parts[i]),
        "persistent_copy_s": lambda i: out.view(-1).narrow(0, 8 * i, 8).copy_(parts[i].narrow(0, 0, 8)),
    }
    best = {}
    for name, body in loops.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(chunk):
                body(i)
            times.append((time.perf_counter() - start) / chunk)
        best[name] = min(times)
    dist.destroy_process_group()
    return LoopCosts(**best)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure the per-iteration host costs (needs torch)")
    parser.add_argument("rows", nargs="*", default=["narayanan21-t2-zero3"], help="row id substrings")
    args = parser.parse_args(argv)
    if args.measure:
        costs = measure()
        print("  ".join(f"{k} {v * 1e6:.2f} us" for k, v in vars(costs).items()))
        return 0
    import fidelity
    from planner.calibrate import default_graph_for

    rows = fidelity._with_files([r for r in fidelity.load_rows([ROWS]) if any(w in r.id for w in args.rows)])
    graph_for = default_graph_for()
    for row in rows:
        report_row(row, graph_for, LoopCosts())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

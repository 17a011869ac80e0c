r"""Measured vs roofline forward time per op family on this machine (the table in docs/COST_MODEL.md).

For every op of a model and every distinct split of it (the configurations ``planner profile``
enumerates for ``--devices``), this compares two forward times of the per-device shard:

* measured: the median onnxruntime kernel time stored by ``planner profile`` in a profile database
  (:mod:`objectives.profile`, looked up by the shard's signature);
* roofline: :func:`objectives.compute.op_compute_time_s` on the host CPU described as a device by
  ``bench/host_cpu.yaml`` (peak FLOP/s from a numpy float32 GEMM, memory bandwidth from a large
  numpy copy, both by CPU time so that other jobs on the machine do not lower them: ``--calibrate``
  measures both and rewrites the file), in fp32.

``--versus-db`` adds run-to-run ratios against a second database of the same model, and
``--thread-check OP`` times an op's unsplit shard on one thread and on all, to size how much a
shared machine slows long kernels down.

Each distinct (shard signature, roofline time) is counted once, so a 12-layer model does not count
a layer's shard 12 times. Per family (``Op.kind``, or ``--group-by op_type`` / ``kind+fused``) it
prints the number of shards, the median ratio measured / roofline and its spread (p10-p90, min-max)
as a Markdown table.

Usage::

    .venv/bin/python bench/cost_model.py --calibrate
    .venv/bin/planner profile examples/gpt2.onnx --dim batch=1 --dim seq=128 --devices 4 --profile-db /tmp/gpt2.db
    .venv/bin/python bench/cost_model.py examples/gpt2.onnx --dim batch=1 --dim seq=128 --devices 4 \
        --profile-db /tmp/gpt2.db
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

__all__ = [
    "HOST_CPU_FILE",
    "GroupBy",
    "ShardPair",
    "FamilyStats",
    "gemm_flops",
    "copy_bytes",
    "median_rate",
    "Rates",
    "gemm_peak_flops_per_s",
    "copy_bandwidth_bytes_per_s",
    "host_cpu_document",
    "write_host_cpu",
    "collect_pairs",
    "ThreadCheck",
    "thread_check",
    "group_label",
    "summarize",
    "versus",
    "markdown_table",
    "main",
]

ROOT = Path(__file__).resolve().parents[1]
HOST_CPU_FILE = ROOT / "bench" / "host_cpu.yaml"
"""The cluster file describing this machine's CPU as one device."""

GroupBy = Literal["kind", "op_type", "kind+fused"]


# --------------------------------------------------------------------------------------------------
# Calibration: this CPU as a device.


def gemm_flops(size: int) -> float:
    """FLOPs of one ``size x size`` by ``size x size`` matrix product (a multiply-add is 2 FLOPs).

    Examples
    --------
    >>> gemm_flops(2)
    16.0
    """
    return 2.0 * float(size) ** 3


def copy_bytes(nbytes: int) -> float:
    """Bytes a copy of an ``nbytes`` buffer moves: read once, written once (STREAM's convention).

    Examples
    --------
    >>> copy_bytes(100)
    200.0
    """
    return 2.0 * float(nbytes)


def median_rate(work: float, times_s: Sequence[float], *, parallel: int = 1) -> float:
    """Work per second of a fixed amount of ``work`` over the median of ``times_s``.

    ``parallel``: threads that shared the work, when ``times_s`` are CPU seconds summed over them
    (so ``median / parallel`` is the time the work takes with every thread running).

    Examples
    --------
    >>> median_rate(10.0, [1.0, 2.0, 5.0])
    5.0
    >>> median_rate(10.0, [2.0, 4.0, 10.0], parallel=2)  # CPU seconds of two threads
    5.0
    """
    if not times_s or min(times_s) <= 0 or parallel < 1:
        raise ValueError("need at least one positive time and parallel >= 1")
    return work / (statistics.median(times_s) / parallel)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """One benchmark's rate by two clocks (units of work per second)."""

    wall: float
    """Work / median wall-clock time: what the (shared) machine gave this run."""
    cpu: float
    """Work / (median CPU time / threads): the rate while every thread runs, i.e. with the machine
    to itself; insensitive to other jobs taking the cores (and to the time slices lost to them)."""


def _time_repeats(body: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of ``repeats`` calls, after one warm-up call."""
    body()  # warm-up: page faults, BLAS thread start
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        body()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def gemm_peak_flops_per_s(*, size: int = 2048, repeats: int = 9) -> Rates:
    """float32 FLOP/s of numpy's ``size``-cubed matrix product (its BLAS, all its threads)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)
    walls, cpus = _time_repeats(lambda: np.matmul(a, b, out=out), repeats)
    work = gemm_flops(size)
    return Rates(wall=median_rate(work, walls), cpu=median_rate(work, cpus, parallel=_threads()))


def copy_bandwidth_bytes_per_s(*, nbytes: int = 2**28, repeats: int = 9) -> Rates:
    """Bytes/s of ``np.copyto`` of ``nbytes`` (far above cache), split over one thread per core.

    numpy copies on one thread and releases the GIL, so each core copies its share at once, as
    onnxruntime's elementwise kernels do.
    """
    from concurrent.futures import ThreadPoolExecutor

    threads = _threads()
    share = nbytes // 4 // threads
    sources = [np.ones(share, dtype=np.float32) for _ in range(threads)]
    targets = [np.zeros_like(x) for x in sources]
    with ThreadPoolExecutor(threads) as pool:

        def copy_all() -> None:
            list(pool.map(np.copyto, targets, sources))

        walls, cpus = _time_repeats(copy_all, repeats)
    work = copy_bytes(share * 4 * threads)
    return Rates(wall=median_rate(work, walls), cpu=median_rate(work, cpus, parallel=threads))


def host_cpu_document(
    *,
    name: str,
    peak_fp32_flops_per_s: float,
    memory_bandwidth_bytes_per_s: float,
    memory_bytes: int,
    source: str,
) -> dict:
    """The cluster-file mapping (``objectives.cluster.load_cluster`` format) of this CPU as one device.

    Examples
    --------
    >>> doc = host_cpu_document(name="cpu", peak_fp32_flops_per_s=1e11,
    ...                         memory_bandwidth_bytes_per_s=1e10, memory_bytes=2**30, source="test")
    >>> doc["device"]["peak_flops"], doc["devices"]
    ({'fp32': 100000000000.0}, 1)
    """
    return {
        "device": {
            "name": name,
            "peak_flops": {"fp32": float(peak_fp32_flops_per_s)},
            "memory_bytes": int(memory_bytes),
            "memory_bandwidth_bytes_per_s": float(memory_bandwidth_bytes_per_s),
            "source": source,
        },
        # one device: the benchmark reads only the device; the links are the loader's defaults
        "devices": 1,
    }


def _physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def write_host_cpu(
    path: Path = HOST_CPU_FILE, *, repeats: int = 9, clock: Literal["cpu", "wall"] = "cpu"
) -> dict:
    """Measure this CPU (GEMM peak, copy bandwidth) and write it as a cluster file; returns the mapping.

    ``clock="cpu"`` (default) keeps the CPU-time rates, which do not depend on what else runs on
    the machine; ``"wall"`` the wall-clock rates of this moment. Both are written in ``source``.
    """
    import yaml

    from objectives.profile import detect_device_name

    flops = gemm_peak_flops_per_s(repeats=repeats)
    bandwidth = copy_bandwidth_bytes_per_s(repeats=repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    source = (
        f"[Empirical] bench/cost_model.py --calibrate --clock {clock}, {time.strftime('%Y-%m-%d')}, "
        f"{_threads()} threads, 1-min load average {load:.1f}. fp32: numpy float32 2048^3 GEMM, median "
        f"of {repeats}: {flops.cpu:.3e} FLOP/s by CPU time, {flops.wall:.3e} by wall clock. Bandwidth: "
        f"np.copyto of 256 MiB split over the threads, read + write counted, median of {repeats}: "
        f"{bandwidth.cpu:.3e} B/s by CPU time, {bandwidth.wall:.3e} by wall clock. Kept: the {clock} "
        f"figures."
    )
    document = host_cpu_document(
        name=f"host-cpu: {detect_device_name('cpu')}",
        peak_fp32_flops_per_s=getattr(flops, clock),
        memory_bandwidth_bytes_per_s=getattr(bandwidth, clock),
        memory_bytes=_physical_memory_bytes(),
        source=source,
    )
    header = (
        "# This machine's CPU as a planner device (objectives.cluster.load_cluster format).\n"
        "# Written by: .venv/bin/python bench/cost_model.py --calibrate  (rerun to refresh).\n"
    )
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, width=100), encoding="utf-8")
    return document


# --------------------------------------------------------------------------------------------------
# Pairs of (measured, roofline) per shard.


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPair:
    """One distinct per-device shard with both forward times."""

    kind: str
    """``Op.kind`` of the op (the family)."""
    op_type: str
    fused_pointwise: int
    """Elementwise ops folded into the op (in the roofline's FLOPs, not in the measured node)."""
    signature: str
    """The shard's profile signature (``ShardSpec.key``)."""
    description: str
    measured_s: float
    """Median measured forward time (s); ``nan`` when the database has no timing."""
    spread_s: float
    """Interquartile range of the measured runs (s); ``nan`` when unmeasured."""
    roofline_s: float
    """Roofline forward time (s)."""
    compute_bound: bool
    """The roofline's FLOP term exceeds its bytes term."""
    configs: int
    """(op, configuration) pairs of the model that map to this shard."""

    @property
    def ratio(self) -> float:
        """``measured / roofline`` (``nan`` when unmeasured, ``inf`` for a zero roofline)."""
        if self.roofline_s <= 0:
            return float("inf") if self.measured_s > 0 else float("nan")
        return self.measured_s / self.roofline_s


def _tensor_view(graph) -> dict:
    """The graph's tensors plus tied-parameter aliases resolved to their canonical tensor."""
    from objectives._common import canonical_parameter

    tensors = dict(graph.tensors)
    for alias in graph.parameter_aliases:
        if alias not in tensors:
            canonical = graph.tensors.get(canonical_parameter(graph, alias))
            if canonical is not None:
                tensors[alias] = canonical
    return tensors


def collect_pairs(
    graph,
    spaces: Sequence,
    *,
    timings: Mapping[str, tuple[float, float]],
    device,
    settings,
) -> tuple[list[ShardPair], dict[str, int]]:
    """Measured and roofline forward time of every distinct shard of ``graph`` over ``spaces``.

    Parameters
    ----------
    graph:
        An :class:`~planner.core.graph.OpGraph`.
    spaces:
        One :class:`~planner.core.configs.ConfigSpace` per op (rows differing only in node placement
        are one shard).
    timings:
        Shard signature -> (median forward s, interquartile range s), from a profile database.
    device:
        The :class:`~planner.core.cluster.Device` the roofline is computed for.
    settings:
        :class:`~planner.core.settings.TrainingSettings` (precision: peak and element sizes).

    Returns
    -------
    (pairs, unrebuildable)
        One :class:`ShardPair` per distinct (signature, roofline time), measured or not; and per
        op kind the configurations whose node cannot be rebuilt at the shard (no signature).
    """
    from objectives.compute import (
        DEFAULT_EFFICIENCY,
        FAMILY_EFFICIENCY,
        compute_dtype,
        op_compute_time_s,
        peak_flops_per_s,
    )
    from objectives.onnx_build import shard_spec_or_reason

    tensors = _tensor_view(graph)
    peak = peak_flops_per_s(device, compute_dtype(settings))
    pairs: dict[tuple[str, float], ShardPair] = {}
    unrebuildable: dict[str, int] = {}
    for op, space in zip(graph.ops, spaces):
        forward = op_compute_time_s(op, space, tensors=tensors, device=device, settings=settings).forward_s
        # the FLOP term alone, to say which side of the roofline the shard is on
        flop_s = (op.flops / space.devices_used) / (peak * FAMILY_EFFICIENCY.get(op.kind, DEFAULT_EFFICIENCY))
        _, first_rows = np.unique(space.factors, axis=0, return_index=True)
        for row in sorted(int(r) for r in first_rows):
            factors = {name: int(f) for name, f in zip(space.dim_names, space.factors[row])}
            spec = shard_spec_or_reason(op, factors)
            if isinstance(spec, str):
                unrebuildable[op.kind] = unrebuildable.get(op.kind, 0) + 1
                continue
            roofline = float(forward[row])
            key = (spec.key, roofline)
            previous = pairs.get(key)
            if previous is not None:
                pairs[key] = _with_configs(previous, previous.configs + 1)
                continue
            median_s, spread_s = timings.get(spec.key, (float("nan"), float("nan")))
            pairs[key] = ShardPair(
                kind=op.kind,
                op_type=op.op_type,
                fused_pointwise=op.fused_pointwise,
                signature=spec.key,
                description=spec.description,
                measured_s=float(median_s),
                spread_s=float(spread_s),
                roofline_s=roofline,
                compute_bound=bool(flop_s[row] + device.kernel_latency_s >= forward[row]) and op.flops > 0,
                configs=1,
            )
    return list(pairs.values()), unrebuildable


def _with_configs(pair: ShardPair, configs: int) -> ShardPair:
    from dataclasses import replace

    return replace(pair, configs=configs)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadCheck:
    """One shard run by onnxruntime on one thread and on every core (medians, seconds)."""

    description: str
    one_thread_wall_s: float
    one_thread_cpu_s: float
    """CPU time of the one-thread run: the work of one core, whatever else runs on the machine."""
    all_threads_wall_s: float
    """Wall time with ``threads`` intra-op threads, as ``planner profile`` runs it."""
    threads: int


def thread_check(op, factors: Mapping[str, int], *, repeats: int = 15) -> ThreadCheck:
    """Time one shard as ``planner profile`` does (graph optimisations off), on 1 and on all threads.

    On a machine other jobs share, a kernel longer than a scheduler time slice loses cores to them,
    and a multi-threaded one waits for its slowest thread; one thread's CPU time is immune to both.
    Times are of ``session.run`` (15-30 us of Python and binding included, unlike the profiler's
    kernel times), so compare only kernels of a millisecond or more.
    """
    import onnxruntime as ort

    from objectives.onnx_build import build_shard_model, random_inputs, shard_spec

    spec = shard_spec(op, factors)
    if spec is None:
        raise SystemExit(f"op {op.name}: its node cannot be rebuilt at this shard")
    feeds = random_inputs(spec)
    model = build_shard_model(spec).SerializeToString()
    results = {}
    for threads in (1, _threads()):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        walls, cpus = _time_repeats(lambda: session.run(None, feeds), repeats)
        results[threads] = (statistics.median(walls), statistics.median(cpus))
    return ThreadCheck(
        description=spec.description,
        one_thread_wall_s=results[1][0],
        one_thread_cpu_s=results[1][1],
        all_threads_wall_s=results[_threads()][0],
        threads=_threads(),
    )


# --------------------------------------------------------------------------------------------------
# Statistics and the table.


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyStats:
    """Measured / roofline ratio statistics of one family."""

    family: str
    shards: int
    """Distinct shards with a timing (the ratio statistics are over these)."""
    unmeasured: int
    """Distinct shards without a timing."""
    configs: int
    """(op, configuration) pairs behind the measured shards."""
    median_ratio: float
    p10_ratio: float
    p90_ratio: float
    min_ratio: float
    max_ratio: float
    median_measured_s: float
    median_roofline_s: float
    compute_bound: float
    """Fraction of the measured shards whose roofline is compute-bound."""
    median_relative_spread: float
    """Median over shards of (interquartile range / median) of the repeated runs."""


def group_label(pair: ShardPair, group_by: GroupBy = "kind") -> str:
    """The row a shard belongs to.

    Examples
    --------
    >>> p = ShardPair(kind="elementwise", op_type="Add", fused_pointwise=7, signature="s",
    ...               description="", measured_s=1.0, spread_s=0.0, roofline_s=2.0,
    ...               compute_bound=False, configs=1)
    >>> group_label(p), group_label(p, "op_type"), group_label(p, "kind+fused")
    ('elementwise', 'Add', 'elementwise +7 fused')
    """
    if group_by == "op_type":
        return pair.op_type
    if group_by == "kind+fused":
        return f"{pair.kind} +{pair.fused_pointwise} fused" if pair.fused_pointwise else pair.kind
    return pair.kind


def summarize(pairs: Iterable[ShardPair], *, group_by: GroupBy = "kind") -> list[FamilyStats]:
    """Per family: shard counts and the median and spread of ``measured / roofline``.

    Families are sorted by name; one with no measured shard gets ``nan`` statistics. Shards with a
    zero roofline (no FLOPs, no bytes) are left out of the ratios.

    Examples
    --------
    >>> def pair(kind, measured, roofline):
    ...     return ShardPair(kind=kind, op_type="X", fused_pointwise=0, signature=str(measured),
    ...                      description="", measured_s=measured, spread_s=0.1 * measured,
    ...                      roofline_s=roofline, compute_bound=True, configs=2)
    >>> [s] = summarize([pair("matmul", 1.0, 1.0), pair("matmul", 4.0, 1.0), pair("matmul", 2.0, 1.0)])
    >>> (s.family, s.shards, s.configs, s.median_ratio, s.min_ratio, s.max_ratio)
    ('matmul', 3, 6, 2.0, 1.0, 4.0)
    """
    groups: dict[str, list[ShardPair]] = {}
    for pair in pairs:
        groups.setdefault(group_label(pair, group_by), []).append(pair)
    stats = []
    for family in sorted(groups):
        members = groups[family]
        done = [p for p in members if np.isfinite(p.measured_s) and p.roofline_s > 0]
        if done:
            ratio = np.array([p.measured_s for p in done]) / np.array([p.roofline_s for p in done])
            p10, median, p90 = np.percentile(ratio, [10, 50, 90])
            low, high = float(ratio.min()), float(ratio.max())
            measured = float(np.median([p.measured_s for p in done]))
            roofline = float(np.median([p.roofline_s for p in done]))
            bound = float(np.mean([p.compute_bound for p in done]))
            spread = float(np.median([p.spread_s / p.measured_s for p in done]))
        else:
            p10 = median = p90 = low = high = measured = roofline = bound = spread = float("nan")
        stats.append(
            FamilyStats(
                family=family,
                shards=len(done),
                unmeasured=sum(1 for p in members if not np.isfinite(p.measured_s)),
                configs=sum(p.configs for p in done),
                median_ratio=float(median),
                p10_ratio=float(p10),
                p90_ratio=float(p90),
                min_ratio=low,
                max_ratio=high,
                median_measured_s=measured,
                median_roofline_s=roofline,
                compute_bound=bound,
                median_relative_spread=spread,
            )
        )
    return stats


def versus(pairs: Iterable[ShardPair], other: Mapping[str, tuple[float, float]]) -> list[ShardPair]:
    """The measured shards with their roofline replaced by another run's median (run-to-run ratios).

    Shards the other run lacks are dropped.

    Examples
    --------
    >>> p = ShardPair(kind="norm", op_type="X", fused_pointwise=0, signature="s", description="",
    ...               measured_s=2.0, spread_s=0.0, roofline_s=9.0, compute_bound=False, configs=1)
    >>> [q.ratio for q in versus([p], {"s": (4.0, 0.0)})], versus([p], {})
    ([0.5], [])
    """
    from dataclasses import replace

    return [
        replace(p, roofline_s=other[p.signature][0])
        for p in pairs
        if p.signature in other and np.isfinite(p.measured_s)
    ]


def _ratio(value: float) -> str:
    if not np.isfinite(value):
        return "-"
    return f"{value:.3g}"


def _us(value_s: float) -> str:
    return "-" if not np.isfinite(value_s) else f"{value_s * 1e6:.3g}"


def markdown_table(
    stats: Sequence[FamilyStats],
    *,
    family_header: str = "family",
    reference: str = "roofline",
) -> str:
    """The statistics as a Markdown table (times in microseconds); ``reference`` names the denominator.

    Examples
    --------
    >>> s = FamilyStats(family="norm", shards=2, unmeasured=1, configs=5, median_ratio=3.0,
    ...                 p10_ratio=2.0, p90_ratio=4.0, min_ratio=1.5, max_ratio=4.5,
    ...                 median_measured_s=3e-5, median_roofline_s=1e-5, compute_bound=0.0,
    ...                 median_relative_spread=0.05)
    >>> print(markdown_table([s]).splitlines()[-1])
    | norm | 2 | 1 | 5 | 3 | 2-4 | 1.5-4.5 | 30 | 10 | 0% | 5% |
    """
    lines = [
        f"| {family_header} | shards | unmeasured | (op, config) pairs | median measured/{reference} | "
        f"p10-p90 | min-max | median measured (us) | median {reference} (us) | compute-bound | run IQR/median |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        bound = "-" if not np.isfinite(s.compute_bound) else f"{s.compute_bound:.0%}"
        spread = "-" if not np.isfinite(s.median_relative_spread) else f"{s.median_relative_spread:.0%}"
        lines.append(
            f"| {s.family} | {s.shards} | {s.unmeasured} | {s.configs} | {_ratio(s.median_ratio)} | "
            f"{_ratio(s.p10_ratio)}-{_ratio(s.p90_ratio)} | {_ratio(s.min_ratio)}-{_ratio(s.max_ratio)} | "
            f"{_us(s.median_measured_s)} | {_us(s.median_roofline_s)} | {bound} | {spread} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Command line.


def _timings(db_path: Path, *, provider: str, device_name: str) -> dict[str, tuple[float, float]]:
    from objectives.profile import ProfileDB

    if not db_path.exists():
        raise SystemExit(f"profile database {db_path} does not exist; run `planner profile` first")
    with ProfileDB(db_path) as db:
        return {
            row.signature: (row.median_s, row.spread_s)
            for row in db.rows()
            if row.provider == provider and row.device_name == device_name
        }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="ONNX model (profiled with `planner profile`)")
    parser.add_argument("--dim", action="append", default=[], help="NAME=INT, as given to planner profile")
    parser.add_argument("--devices", type=int, default=4, help="as given to planner profile")
    parser.add_argument("--devices-per-node", type=int, default=None)
    parser.add_argument("--profile-db", type=Path, default=Path("planner-profile.db"))
    parser.add_argument("--cluster", type=Path, default=HOST_CPU_FILE, help="the host CPU as a device")
    parser.add_argument("--device-name", default=None, help="database key (default: this machine's)")
    parser.add_argument("--versus-db", type=Path, default=None,
                        help="another profile database of the same model: also print run-to-run ratios")
    parser.add_argument("--thread-check", action="append", default=[], metavar="OP",
                        help="also time this op's unsplit shard on 1 and on all threads (repeatable)")
    parser.add_argument("--group-by", choices=("kind", "op_type", "kind+fused"), default="kind")
    parser.add_argument("--calibrate", action="store_true", help=f"measure this CPU and rewrite {HOST_CPU_FILE.name}")
    parser.add_argument("--repeats", type=int, default=9, help="calibration repeats (median kept)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="calibration rates to keep")
    args = parser.parse_args(argv)

    if args.calibrate:
        document = write_host_cpu(args.cluster, repeats=args.repeats, clock=args.clock)
        device = document["device"]
        print(
            f"wrote {args.cluster}: fp32 peak {device['peak_flops']['fp32']:.3e} FLOP/s, "
            f"bandwidth {device['memory_bandwidth_bytes_per_s']:.3e} B/s"
        )
        if args.model is None:
            return 0
    if args.model is None:
        parser.error("give a model, or --calibrate")

    from objectives.cluster import load_cluster
    from objectives.profile import detect_device_name
    from planner.core.dims import parse_dims
    from planner.core.configs import ConfigOptions, enumerate_configs
    from planner.core.settings import TrainingSettings
    from planner.plan import load_graph

    if not args.cluster.exists():
        raise SystemExit(f"{args.cluster} does not exist; run bench/cost_model.py --calibrate first")
    device = load_cluster(args.cluster).device
    graph = load_graph(args.model, parse_dims(args.dim))
    options = ConfigOptions(
        devices=args.devices, devices_per_node=args.devices_per_node or min(args.devices, 8)
    )
    spaces = [enumerate_configs(op, options) for op in graph.ops]
    device_name = args.device_name or detect_device_name("cpu")
    timings = _timings(args.profile_db, provider="cpu", device_name=device_name)
    # the profiler runs float32 on CPU, so the roofline is the fp32 one with 4-byte elements
    settings = TrainingSettings(precision="fp32")
    pairs, unrebuildable = collect_pairs(graph, spaces, timings=timings, device=device, settings=settings)
    header = "op type" if args.group_by == "op_type" else "family"
    print(f"<!-- {args.model} {' '.join('--dim ' + d for d in args.dim)} --devices {args.devices}; "
          f"roofline device: {device.name}; fp32 peak {device.peak_flops['fp32']:.3e} FLOP/s, "
          f"bandwidth {device.memory_bandwidth_bytes_per_s:.3e} B/s -->")
    print(markdown_table(summarize(pairs, group_by=args.group_by), family_header=header))
    if args.versus_db is not None:
        other = _timings(args.versus_db, provider="cpu", device_name=device_name)
        print(f"\nrun to run: {args.profile_db} / {args.versus_db} (\"other\" = the second database)\n")
        print(markdown_table(summarize(versus(pairs, other), group_by=args.group_by),
                             family_header=header, reference="other"))
    by_name = {op.name: op for op in graph.ops}
    for name in args.thread_check:
        if name not in by_name:
            raise SystemExit(f"--thread-check {name}: no such op; ops are named after their main ONNX node")
        check = thread_check(by_name[name], {})
        roofline = next((p.roofline_s for p in pairs if p.description == check.description), float("nan"))
        print(
            f"\n{name}: {check.description}: 1 thread wall {check.one_thread_wall_s * 1e6:.0f} us "
            f"(CPU {check.one_thread_cpu_s * 1e6:.0f} us), {check.threads} threads wall "
            f"{check.all_threads_wall_s * 1e6:.0f} us, 1-thread CPU / {check.threads} = "
            f"{check.one_thread_cpu_s / check.threads * 1e6:.0f} us; roofline {roofline * 1e6:.0f} us; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
    if unrebuildable:
        listed = ", ".join(f"{kind} {count}" for kind, count in sorted(unrebuildable.items()))
        print(f"\nconfigurations whose node cannot be rebuilt at the shard (no timing possible): {listed}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

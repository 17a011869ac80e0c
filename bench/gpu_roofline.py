r"""Measured (PyTorch, bf16) vs roofline forward and backward time per op family, on a GPU.

``bench/cost_model.py`` compares the roofline with onnxruntime on the host CPU. This benchmark asks
the same question of a GPU, where the planner's plans run: for every op of a model and every
distinct per-device shard under a few configurations, it times the equivalent PyTorch call in
bf16, forward and backward (autograd), and divides by the roofline of
:func:`objectives.compute.op_compute_time_s` for a device preset (``h100-sxm`` by default) under
``bf16-mixed``.

Mapping an op to PyTorch
------------------------
The library's mapping, :func:`objectives.torch_profile.torch_call` (the one ``planner profile
--provider torch-cuda`` uses; see its module docstring): matmul (``matmul``/``bmm``/``addmm``), norm
(``layer_norm``/``rms_norm``), softmax, elementwise, embedding, slice and concat. Other families
(conv, pool, reduce, rnn, data movement, opaque) are skipped and counted. Elementwise ops the
importer fused into a coarse op are not run (they are in the roofline's FLOPs and not in the timing,
as for ``planner profile``); the tables can be split by fused count (``--group-by``).

Shards come from :func:`planner.core.configs.enumerate_configs` with ``--devices`` (default 8) and
``--max-split-dims`` (default 1: the unsplit op and every single-dim split of 2, 4, 8, i.e. data-
and tensor-parallel-like splits). Each distinct (PyTorch call, roofline) counts once.

Timing (:func:`time_call`)
--------------------------
:func:`objectives.torch_profile.time_runs`: CUDA events around one call, median of ``--repeats``
(default 25) after ``--warmup`` calls; before each timed call a 256 MiB buffer is zeroed (L2 flushed:
H100's L2 is 50 MB, and an activation is rarely still in it when the next op runs) and the GPU is
held by ``torch.cuda._sleep`` while the host queues the call, so the event pair times GPU work only,
not Python's launch cost. Backward is ``torch.autograd.grad`` of the forward's outputs with respect
to every float input (activations and parameters) with a random output gradient, on a retained
graph (:func:`objectives.torch_profile.build_call`). On ``--device cpu`` the wall clock is used
(only to test this script: the roofline device stays the GPU preset).

Usage::

    python3 bench/gpu_roofline.py --out /tmp/gpu                           # on a GPU machine
    .venv-integration/bin/python bench/gpu_roofline.py --device cpu --quick  # smoke test, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from objectives.compute import (  # noqa: E402
    BACKWARD_BYTES_FACTOR,
    DEFAULT_EFFICIENCY,
    FAMILY_EFFICIENCY,
    MEMORY_BANDWIDTH_EFFICIENCY,
    compute_dtype,
    forward_bytes,
    op_compute_time_s,
    peak_flops_per_s,
)
from planner.core.dims import parse_dims  # noqa: E402
from planner.core.cluster import Device  # noqa: E402
from planner.core.configs import ConfigOptions, enumerate_configs  # noqa: E402
from planner.core.graph import OpGraph  # noqa: E402
from planner.core.settings import TrainingSettings  # noqa: E402
from objectives.torch_profile import (  # noqa: E402
    BINARY_OPS,
    UNARY_OPS,
    TorchCall,
    build_call,
    tensor_view,
    time_runs,
    torch_call,
    torch_device_name,
)

__all__ = [
    "BINARY_OPS",
    "UNARY_OPS",
    "TorchCall",
    "ShardRow",
    "torch_call",
    "shard_rows",
    "time_call",
    "reference_rates",
    "FamilySummary",
    "summarize",
    "markdown_table",
    "main",
]

# --------------------------------------------------------------------------------------------------
# Shards of a model with their roofline times.


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRow:
    """One distinct (PyTorch call, roofline) shard, with its measured times once timed."""

    model: str
    op: str
    """Name of the first op that has this shard."""
    kind: str
    op_type: str
    fused_pointwise: int
    factors: dict[str, int]
    """Split dims of the first configuration that gives this shard."""
    call: str
    """:meth:`TorchCall.describe`."""
    flops: float
    """Forward FLOPs of the shard (the op's, fused ops included)."""
    bytes: float
    """Forward bytes of the shard (``objectives.compute.forward_bytes``)."""
    roofline_forward_s: float
    roofline_backward_s: float
    compute_bound: bool
    """The roofline's forward FLOP term is at least its bytes term (and the op has FLOPs)."""
    backward_flops_factor: float
    configs: int = 1
    """(op, configuration) pairs of the model with this shard."""
    measured_forward_s: float = float("nan")
    measured_backward_s: float = float("nan")

    @property
    def forward_ratio(self) -> float:
        return self.measured_forward_s / self.roofline_forward_s if self.roofline_forward_s > 0 else float("nan")

    @property
    def backward_ratio(self) -> float:
        return self.measured_backward_s / self.roofline_backward_s if self.roofline_backward_s > 0 else float("nan")


def shard_rows(
    graph: OpGraph,
    options: ConfigOptions,
    *,
    device: Device,
    settings: TrainingSettings,
) -> tuple[list[tuple[ShardRow, TorchCall]], dict[str, int]]:
    """Every distinct mappable shard of ``graph`` under ``options``' configurations, with rooflines.

    Returns
    -------
    (rows, skipped)
        One ``(ShardRow, TorchCall)`` per distinct (call, roofline forward, roofline backward); and
        per op kind the (op, configuration) pairs that could not be mapped (skipped).
    """
    tensors = tensor_view(graph)
    peak = peak_flops_per_s(device, compute_dtype(settings))
    found: dict[tuple, tuple[ShardRow, TorchCall]] = {}
    skipped: dict[str, int] = {}
    for op in graph.ops:
        space = enumerate_configs(op, options)
        times = op_compute_time_s(op, space, tensors=tensors, device=device, settings=settings)
        num_bytes = forward_bytes(op, space, tensors=tensors, settings=settings)
        flops = op.flops / space.devices_used.astype(np.float64)
        flop_s = flops / (peak * FAMILY_EFFICIENCY.get(op.kind, DEFAULT_EFFICIENCY))
        for row in range(space.size):
            factors = {n: int(f) for n, f in zip(space.dim_names, space.factors[row])}
            call = torch_call(op, factors, tensors=tensors)
            if isinstance(call, str):
                skipped[op.kind] = skipped.get(op.kind, 0) + 1
                continue
            forward, backward = float(times.forward_s[row]), float(times.backward_s[row])
            key = (op.kind, call.key, forward, backward)
            if key in found:
                shard, _ = found[key]
                found[key] = (_replace(shard, configs=shard.configs + 1), call)
                continue
            found[key] = (
                ShardRow(
                    model=graph.name,
                    op=op.name,
                    kind=op.kind,
                    op_type=op.op_type,
                    fused_pointwise=op.fused_pointwise,
                    factors={n: f for n, f in factors.items() if f > 1},
                    call=call.describe(),
                    flops=float(flops[row]),
                    bytes=float(num_bytes[row]),
                    roofline_forward_s=forward,
                    roofline_backward_s=backward,
                    compute_bound=bool(op.flops > 0 and flop_s[row] >= forward),
                    backward_flops_factor=op.backward_flops_factor,
                ),
                call,
            )
    return list(found.values()), skipped


def _replace(row: ShardRow, **changes) -> ShardRow:
    from dataclasses import replace

    return replace(row, **changes)


# --------------------------------------------------------------------------------------------------
# Timing (torch imported by objectives.torch_profile's runners only).


def time_call(fn: Callable[[], object], *, device: str, warmup: int, repeats: int, flush: bool = True) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after ``warmup`` (:func:`objectives.torch_profile.time_runs`)."""
    return statistics.median(time_runs(fn, device=device, warmup=warmup, repeats=repeats, flush=flush))


def reference_rates(device: str, *, flush: bool = True) -> dict[str, float]:
    """What the hardware reaches on two simple kernels, with :func:`time_call`'s method.

    ``gemm_flops_per_s``: an 8192^3 bf16 matrix product (1024^3 on CPU); ``copy_bytes_per_s``: a
    1 GiB bf16 ``copy_`` (64 MiB on CPU), read + write counted. The efficiencies they imply against
    the preset are the best the roofline's ``eta`` can honestly be.
    """
    import torch

    size, elements = (8192, 2**29) if device != "cpu" else (1024, 2**25)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    src = torch.randn(elements, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    gemm_s = time_call(lambda: torch.matmul(a, b), device=device, warmup=5, repeats=25, flush=flush)
    copy_s = time_call(lambda: dst.copy_(src), device=device, warmup=5, repeats=25, flush=flush)
    return {
        "gemm_size": size,
        "gemm_flops_per_s": 2.0 * size**3 / gemm_s,
        "copy_bytes": 2.0 * elements * 2,
        "copy_bytes_per_s": 2.0 * elements * 2 / copy_s,
    }


def _measure(
    pairs: list[tuple[ShardRow, TorchCall]], *, device: str, warmup: int, repeats: int, flush: bool, log
) -> list[ShardRow]:
    cache: dict[tuple, tuple[float, float]] = {}
    done = []
    started = time.perf_counter()
    for index, (row, call) in enumerate(pairs):
        if call.key not in cache:
            try:
                forward, backward = build_call(call, device, "bfloat16")
                fwd = time_call(forward, device=device, warmup=warmup, repeats=repeats, flush=flush)
                bwd = time_call(backward, device=device, warmup=warmup, repeats=repeats, flush=flush)
                del forward, backward
            except (RuntimeError, TypeError, ValueError) as error:  # report and go on
                log(f"  {call.describe()}: {type(error).__name__}: {str(error).splitlines()[0]}")
                fwd = bwd = float("nan")
            cache[call.key] = (fwd, bwd)
        fwd, bwd = cache[call.key]
        done.append(_replace(row, measured_forward_s=fwd, measured_backward_s=bwd))
        if (index + 1) % 50 == 0:
            log(f"  {index + 1}/{len(pairs)} shards, {time.perf_counter() - started:.0f} s")
    return done


# --------------------------------------------------------------------------------------------------
# Statistics.


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilySummary:
    """Measured / roofline statistics of one family (over its measured shards)."""

    family: str
    shards: int
    configs: int
    forward_median: float
    forward_min: float
    forward_max: float
    backward_median: float
    backward_min: float
    backward_max: float
    median_measured_forward_s: float
    median_roofline_forward_s: float
    compute_bound: float
    """Fraction of shards whose forward roofline is compute-bound."""
    implied_flop_efficiency: float
    """Median over compute-bound shards of forward FLOP/s / peak (``nan`` if none)."""
    implied_bandwidth_efficiency: float
    """Median over memory-bound shards of forward bytes/s / spec bandwidth (``nan`` if none)."""
    backward_over_forward: float
    """Median over shards of measured backward / measured forward."""


def _label(row: ShardRow, group_by: str) -> str:
    if group_by == "op_type":
        return row.op_type
    if group_by == "kind+fused":
        return f"{row.kind} +{row.fused_pointwise} fused" if row.fused_pointwise else row.kind
    return row.kind


def summarize(rows: Sequence[ShardRow], *, device: Device, settings: TrainingSettings, group_by: str = "kind") -> list[FamilySummary]:
    """Per family: ratio medians and ranges, forward and backward, and the efficiencies they imply.

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> r = ShardRow(model="m", op="o", kind="matmul", op_type="MatMul", fused_pointwise=0,
    ...              factors={}, call="c", flops=1e12, bytes=1.0, roofline_forward_s=1.0,
    ...              roofline_backward_s=2.0, compute_bound=True, backward_flops_factor=2.0,
    ...              measured_forward_s=2.0, measured_backward_s=3.0)
    >>> [s] = summarize([r], device=get_device("h100-sxm"), settings=TrainingSettings())
    >>> (s.shards, s.forward_median, s.backward_median, s.backward_over_forward)
    (1, 2.0, 1.5, 1.5)
    """
    peak = peak_flops_per_s(device, compute_dtype(settings))
    groups: dict[str, list[ShardRow]] = {}
    for row in rows:
        if np.isfinite(row.measured_forward_s) and row.roofline_forward_s > 0:
            groups.setdefault(_label(row, group_by), []).append(row)
    out = []
    for family in sorted(groups):
        members = groups[family]
        fwd = np.array([r.forward_ratio for r in members])
        bwd = np.array([r.backward_ratio for r in members])
        bound = [r for r in members if r.compute_bound]
        free = [r for r in members if not r.compute_bound]
        flop_eff = [r.flops / r.measured_forward_s / peak for r in bound]
        bw_eff = [r.bytes / r.measured_forward_s / device.memory_bandwidth_bytes_per_s for r in free]
        nan = float("nan")
        out.append(
            FamilySummary(
                family=family,
                shards=len(members),
                configs=sum(r.configs for r in members),
                forward_median=float(np.median(fwd)),
                forward_min=float(fwd.min()),
                forward_max=float(fwd.max()),
                backward_median=float(np.nanmedian(bwd)) if np.isfinite(bwd).any() else nan,
                backward_min=float(np.nanmin(bwd)) if np.isfinite(bwd).any() else nan,
                backward_max=float(np.nanmax(bwd)) if np.isfinite(bwd).any() else nan,
                median_measured_forward_s=float(np.median([r.measured_forward_s for r in members])),
                median_roofline_forward_s=float(np.median([r.roofline_forward_s for r in members])),
                compute_bound=len(bound) / len(members),
                implied_flop_efficiency=float(np.median(flop_eff)) if flop_eff else nan,
                implied_bandwidth_efficiency=float(np.median(bw_eff)) if bw_eff else nan,
                backward_over_forward=float(
                    np.nanmedian([r.measured_backward_s / r.measured_forward_s for r in members])
                ),
            )
        )
    return out


def _g(value: float, fmt: str = ".3g") -> str:
    return "-" if not np.isfinite(value) else format(value, fmt)


def markdown_table(stats: Sequence[FamilySummary], *, family_header: str = "family") -> str:
    """The statistics as a Markdown table (times in microseconds, efficiencies as fractions)."""
    lines = [
        f"| {family_header} | shards | (op, config) pairs | fwd measured/roofline median (min-max) | "
        "bwd measured/roofline median (min-max) | median fwd measured / roofline (us) | compute-bound | "
        "implied FLOP eff. | implied BW eff. | bwd/fwd measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        lines.append(
            f"| {s.family} | {s.shards} | {s.configs} | {_g(s.forward_median)} ({_g(s.forward_min)}-"
            f"{_g(s.forward_max)}) | {_g(s.backward_median)} ({_g(s.backward_min)}-{_g(s.backward_max)}) | "
            f"{_g(s.median_measured_forward_s * 1e6)} / {_g(s.median_roofline_forward_s * 1e6)} | "
            f"{s.compute_bound:.0%} | {_g(s.implied_flop_efficiency, '.2f')} | "
            f"{_g(s.implied_bandwidth_efficiency, '.2f')} | {_g(s.backward_over_forward)} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Command line.


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path,
                        default=[ROOT / "examples" / "gpt2.onnx", ROOT / "examples" / "llama.onnx"])
    parser.add_argument("--dim", action="append", default=[], help="NAME=INT (default batch=8, seq=1024)")
    parser.add_argument("--devices", type=int, default=8, help="configurations for this many devices")
    parser.add_argument("--max-split-dims", type=int, default=1, help="dims split at once (default 1)")
    parser.add_argument("--preset", default="h100-sxm", help="roofline device preset")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where torch runs")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (smoke test)")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-flush", action="store_true", help="do not flush L2 before each timed run")
    parser.add_argument("--max-shards", type=int, default=None, help="time at most this many shards")
    parser.add_argument("--out", type=Path, default=None, help="write gpu_roofline.json and .md here")
    args = parser.parse_args(argv)

    from objectives.cluster import make_cluster
    from planner.plan import load_graph

    dims = parse_dims(args.dim) or {"batch": 8, "seq": 1024}
    devices, repeats, warmup = args.devices, args.repeats, args.warmup
    if args.quick:
        dims = parse_dims(args.dim) or {"batch": 1, "seq": 16}
        devices, repeats, warmup = min(devices, 2), min(repeats, 3), min(warmup, 1)
    cluster = make_cluster(args.preset, devices=devices)
    device = cluster.device
    settings = TrainingSettings(precision="bf16-mixed")
    options = ConfigOptions(devices=devices, devices_per_node=cluster.devices_per_node,
                            max_split_dims=args.max_split_dims)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    pairs: list[tuple[ShardRow, TorchCall]] = []
    skipped_all: dict[str, dict[str, int]] = {}
    for path in args.models:
        graph = load_graph(path, dims)
        found, skipped = shard_rows(graph, options, device=device, settings=settings)
        log(f"{path.name}: {len(graph.ops)} ops, {len(found)} distinct shards, skipped (op, config) "
            f"pairs by kind: {skipped or 'none'}")
        pairs.extend(found)
        skipped_all[graph.name] = skipped
    if args.max_shards is not None:
        pairs = pairs[: args.max_shards]
    name = torch_device_name(args.device)
    rates = reference_rates(args.device, flush=not args.no_flush)
    peak = peak_flops_per_s(device, "bf16")
    log(f"reference: {rates['gemm_size']}^3 bf16 GEMM {rates['gemm_flops_per_s']:.4g} FLOP/s "
        f"({rates['gemm_flops_per_s'] / peak:.2f} of {device.name}'s bf16 peak), bf16 copy "
        f"{rates['copy_bytes_per_s']:.4g} B/s ({rates['copy_bytes_per_s'] / device.memory_bandwidth_bytes_per_s:.2f} "
        f"of its bandwidth)")
    log(f"timing {len(pairs)} shards on {name} ({args.device}), {repeats} repeats")
    rows = _measure(pairs, device=args.device, warmup=warmup, repeats=repeats, flush=not args.no_flush, log=log)

    command = "python3 bench/gpu_roofline.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (
        f"<!-- {command}; torch on {name} ({args.device}); models {', '.join(p.name for p in args.models)}; "
        f"dims {dims}; configurations for {devices} devices, at most {args.max_split_dims} split dims; "
        f"roofline: {device.name}, bf16 peak {peak_flops_per_s(device, 'bf16'):.4g} FLOP/s, bandwidth "
        f"{device.memory_bandwidth_bytes_per_s:.4g} B/s x {MEMORY_BANDWIDTH_EFFICIENCY}, backward bytes "
        f"x {BACKWARD_BYTES_FACTOR}; L2 flush {'off' if args.no_flush else 'on'}; reference: "
        f"{rates['gemm_size']}^3 bf16 GEMM {rates['gemm_flops_per_s']:.4g} FLOP/s = "
        f"{rates['gemm_flops_per_s'] / peak:.2f} x peak, copy {rates['copy_bytes_per_s']:.4g} B/s = "
        f"{rates['copy_bytes_per_s'] / device.memory_bandwidth_bytes_per_s:.2f} x bandwidth -->"
    )
    tables = [header]
    for group_by, title in (("kind", "family"), ("kind+fused", "family + fused ops"), ("op_type", "op type")):
        tables.append(markdown_table(summarize(rows, device=device, settings=settings, group_by=group_by),
                                     family_header=title))
    skipped_line = "skipped (op, configuration) pairs: " + "; ".join(
        f"{model}: " + (", ".join(f"{k} {v}" for k, v in sorted(s.items())) or "none")
        for model, s in skipped_all.items()
    )
    tables.append(skipped_line)
    text = "\n\n".join(tables)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_roofline.md").write_text(text + "\n", encoding="utf-8")
        document = {
            "command": command,
            "device": name,
            "torch_device": args.device,
            "dims": dims,
            "devices": devices,
            "preset": device.name,
            "skipped": skipped_all,
            "reference": rates,
            "rows": [asdict(r) for r in rows],
        }
        (args.out / "gpu_roofline.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

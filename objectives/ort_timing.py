r"""How onnxruntime times a shard: one-node models, the profiler's kernel time, the median of repeats.

The ``cpu`` / ``cuda`` providers (:mod:`objectives.profile_providers`, whose
:func:`~objectives.profile_providers.measure_shards` checks the provider and hands each family of
shards to :func:`_measure_family` here) run the op's main ONNX node rebuilt at the shard shape
(:mod:`objectives.onnx_build`); forward only (the cost model takes backward as
``backward_flops_factor`` times it), keyed by the node's shard signature
(:attr:`~objectives.onnx_build.ShardSpec.key`).

A one-node model, ``graph_optimization_level = ORT_DISABLE_ALL`` (the node runs as written, nothing
fused), ``intra_op_num_threads`` = every core this process may use, random inputs of the node's
dtypes (indices inside the shard for Gather-like ops). The first run checks the output shapes
(a wrong rebuild is rejected, not timed), further warm-up runs follow, then ``repeats`` timed runs;
the stored time is the **median** and the spread the interquartile range, since a shared machine's
run times vary a lot (onnx_facts: 760-1150 ms between repeats of one model).

The time of one run is the CPU profiler's kernel time (``SessionOptions.enable_profiling``: the
Chrome-trace event with ``cat == "Node"`` and ``name == "node_kernel_time"``, ``dur`` in
microseconds), not the wall clock of ``session.run``: the wall clock adds 15-30 us of Python, input
binding and output allocation per call, which dominates small kernels and does not exist when the
node runs inside a whole model. The wall clock is the fallback when the trace does not hold exactly
one kernel event per run, and the method on CUDA, where kernel events time the asynchronous launch
rather than the GPU work (there inputs and outputs stay on the device through an ``IOBinding`` and
``run_with_iobinding`` waits for the GPU). Shards with the same model but other shapes share one
session built with symbolic dims (:attr:`~objectives.onnx_build.ShardSpec.model_key`).

When the provider has no kernel for the model's low-precision dtype (float16, bfloat16, float8 on
CPU), the shard is measured in float32 and the row says so in ``measured_dtypes``; the signature stays
that of the model's dtype, so the cost model finds the row from the op alone.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np

from objectives.onnx_build import FLOAT32_FALLBACK, ShardSpec, build_shard_model, check_outputs, random_inputs

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = ["ORT_PROVIDERS", "Measurement"]


#: Our onnxruntime provider names -> onnxruntime execution providers.
ORT_PROVIDERS: dict[str, str] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_MIN_REPEATS = 1
_RESOLUTION_S = 1e-6
"""The profiler's ``dur`` is whole microseconds: a kernel below that is stored as half of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Timing of one shard."""

    median_s: float
    """Median forward time of the timed runs (seconds)."""
    repeats: int
    """Timed runs."""
    spread_s: float
    """Interquartile range of the timed runs (seconds)."""
    measured_dtypes: str
    """Dtypes actually run, comma-separated (float32 where a low-precision dtype fell back)."""
    method: Literal["profiler", "wall", "cuda-events"]
    """``profiler``: onnxruntime's kernel time; ``wall``: wall clock of the run call;
    ``cuda-events``: CUDA events around the call (torch on a GPU)."""
    backward_median_s: float | None = None
    """Median backward time (seconds); ``None`` when the backward was not measured (onnxruntime)."""
    backward_spread_s: float | None = None
    """Interquartile range of the backward runs (seconds)."""


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------
# Measuring.


def _session(model_bytes: bytes, provider: str, profile_prefix: str | None) -> InferenceSession:
    import onnxruntime as ort  # imported when measuring only: the CLI starts faster without it

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = _threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 4  # failures are reported per shard, not logged by onnxruntime
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    providers = [ORT_PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider != "cpu" else [])
    return ort.InferenceSession(model_bytes, options, providers=providers)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _kernel_durations_s(trace_path: str) -> list[float]:
    with open(trace_path, encoding="utf-8") as handle:
        events = json.load(handle)
    kernel = [e for e in events if e.get("cat") == "Node" and e.get("name") == "node_kernel_time"]
    kernel.sort(key=lambda e: e.get("ts", 0))
    return [float(e["dur"]) * 1e-6 for e in kernel]


class _Runner:
    """Runs feeds through one session; on CUDA keeps data on the device."""

    def __init__(self, session: InferenceSession, provider: str) -> None:
        self.session = session
        self.provider = provider

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[list, float]:
        """Outputs (arrays, or shapes on CUDA) and the wall time of the call (seconds)."""
        if self.provider == "cpu":
            start = time.perf_counter()
            outputs = self.session.run(None, feeds)
            return outputs, time.perf_counter() - start
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for output in self.session.get_outputs():
            binding.bind_output(output.name, "cuda")
        start = time.perf_counter()
        self.session.run_with_iobinding(binding)  # synchronises the stream before returning
        elapsed = time.perf_counter() - start
        return [np.empty(v.shape(), dtype=np.uint8) for v in binding.get_outputs()], elapsed


def _measure_family(
    specs: Sequence[ShardSpec],
    *,
    provider: str,
    repeats: int,
    warmup: int,
    time_budget_s: float,
    workdir: str,
) -> list[Measurement | str]:
    """Measure shards that share one model (up to shapes) in one session."""
    # low-precision floats run natively when the provider can, else in float32
    attempts = [True] if any(s.needs_float32 for s in specs) else [False, True]
    if not any(d in FLOAT32_FALLBACK for d in specs[0].dtypes):
        attempts = attempts[:1]
    prefix = os.path.join(workdir, "trace") if provider == "cpu" else None
    session = None
    for float32 in attempts:
        try:
            model = build_shard_model(specs[0], float32=float32, dynamic=len(specs) > 1)
            session = _session(model.SerializeToString(), provider, prefix)
            break
        except Exception as exc:  # noqa: BLE001 (onnxruntime raises its own classes: NotImplemented, Fail...)
            reason = f"onnxruntime cannot run it{' in float32' if float32 else ''}: {_first_line(exc)}"
    if session is None:
        return [reason] * len(specs)
    runner = _Runner(session, provider)

    results: list[Measurement | str] = []
    run_owner: list[int] = []  # index of the shard of every run, in order: profiler events follow it
    walls: list[list[float]] = []
    any_run_failed = False
    for index, spec in enumerate(specs):
        feeds = random_inputs(spec, float32=float32, seed=index)
        timed: list[float] = []
        walls.append(timed)
        try:
            outputs, elapsed = runner.run(feeds)
            run_owner.append(-1)
            problem = check_outputs(spec, list(outputs))
            if problem is not None:
                results.append(f"rebuilt node gives the wrong shape: {problem}")
                continue
            # a slow kernel gets fewer runs: its relative noise is small and the budget is not
            for _ in range(min(max(warmup - 1, 0), int(time_budget_s / max(elapsed, 1e-9)))):
                _, elapsed = runner.run(feeds)
                run_owner.append(-1)
            budget_runs = max(_MIN_REPEATS, int(time_budget_s / max(elapsed, 1e-9)))
            for _ in range(min(repeats, budget_runs)):
                _, elapsed = runner.run(feeds)
                run_owner.append(index)
                timed.append(elapsed)
        except Exception as exc:  # noqa: BLE001 (any kernel error makes this shard unprofilable)
            any_run_failed = True
            results.append(f"onnxruntime failed to run it: {_first_line(exc)}")
            continue
        dtypes = ",".join(
            "float32" if float32 and d in FLOAT32_FALLBACK else d for d in spec.dtypes
        )
        results.append(
            Measurement(median_s=0.0, repeats=len(timed), spread_s=0.0, measured_dtypes=dtypes, method="wall")
        )

    per_shard: list[list[float]] = walls
    method: Literal["profiler", "wall"] = "wall"
    if prefix is not None:
        trace = session.end_profiling()
        try:
            durations = _kernel_durations_s(trace)
        except (OSError, ValueError, KeyError):
            durations = []
        if not any_run_failed and len(durations) == len(run_owner):
            per_shard = [[] for _ in specs]
            for owner, duration in zip(run_owner, durations):
                if owner >= 0:
                    per_shard[owner].append(duration)
            method = "profiler"
    final: list[Measurement | str] = []
    for index, result in enumerate(results):
        if isinstance(result, str):
            final.append(result)
            continue
        times = np.asarray(per_shard[index], dtype=np.float64)
        q25, median, q75 = np.percentile(times, [25, 50, 75])
        final.append(
            Measurement(
                median_s=max(float(median), _RESOLUTION_S / 2),
                repeats=int(times.size),
                spread_s=float(q75 - q25),
                measured_dtypes=result.measured_dtypes,
                method=method,
            )
        )
    return final

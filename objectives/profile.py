r"""Measured time of each op's per-device shard (onnxruntime or PyTorch), cached in SQLite.

FlexFlow prices strategies with measured per-operator times; this module measures them on the
hardware at hand (``planner profile``) so the cost model can use them instead of the roofline.

Providers
---------
:data:`PROVIDERS` names what runs the shards (:class:`Backend`, a registry):

* ``cpu`` / ``cuda``: onnxruntime runs the op's main ONNX node rebuilt at the shard shape
  (:mod:`objectives.onnx_build`); forward only (the cost model takes backward as
  ``backward_flops_factor`` times it). Keyed by the node's shard signature (:attr:`ShardSpec.key`).
* ``torch-cpu`` / ``torch-cuda``: PyTorch runs the call that stands for the shard
  (:mod:`objectives.torch_profile`: GEMM, norm, softmax, elementwise, embedding, slice, concat),
  forward **and backward** (autograd w.r.t. every float input), in ``bfloat16`` on CUDA (the
  ``bf16-mixed`` default) and ``float32`` on CPU unless told. Keyed by
  :func:`objectives.torch_profile.call_signature` (the call and its dtype), so the cost model needs
  the graph's tensors to find a row (:meth:`ProfileDB.lookup_fn`).

Pipeline
--------
:func:`profile_graph` takes every configuration of every op, maps it to its shard with the
provider's backend, keeps each distinct shard signature once, skips those the :class:`ProfileDB`
already holds for this provider and device (so a second run measures nothing: resumable), **claims**
the rest in small batches (a row per shard in ``claims``, so two processes profiling one model into
one file split the work instead of both measuring everything) and measures what it claimed, writing
each batch in its own short transaction. :meth:`ProfileDB.lookup_fn` gives the cost model an
``(op, factors) -> seconds | (forward, backward) | None`` function that reads the same signatures
back; :func:`open_measured` also picks which device's timings a plan uses and says so in notes.

How onnxruntime times a shard
-----------------------------
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
session built with symbolic dims (:attr:`ShardSpec.model_key`).

When the provider has no kernel for the model's low-precision dtype (float16, bfloat16, float8 on
CPU), the shard is measured in float32 and the row says so in ``measured_dtypes``; the signature stays
that of the model's dtype, so the cost model finds the row from the op alone.

The database
------------
One SQLite file marked as ours by ``PRAGMA application_id`` (:data:`APPLICATION_ID`) and a ``meta``
table holding the layout version (:data:`SCHEMA_VERSION`). Any other SQLite file is refused before
anything is written to it (one line, the file left byte for byte as it was); a version-1 file (no
application id, no backward column) is upgraded in place. Tables: ``timings`` keyed by (signature,
provider, device_name) with the forward median and, for torch rows, the backward median;
``failures`` (shards that cannot run here, so they are not retried); ``claims`` (shards a live
process is measuring now: owner host, pid, a token per run and the claim time). A claim is void once
its row is timed, when its process is gone (same host, pid not running) or after
``claim_timeout_s`` (another host's process that died). WAL journal, a busy timeout, and
``INSERT OR IGNORE`` in short ``BEGIN IMMEDIATE`` transactions let several processes profile into one
file at the same time without losing or corrupting rows.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from objectives import torch_profile
from objectives.onnx_build import (
    FLOAT32_FALLBACK,
    ShardSpec,
    build_shard_model,
    check_outputs,
    random_inputs,
    shard_spec,
    shard_spec_or_reason,
)
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import Op, OpGraph, Tensor

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "ORT_PROVIDERS",
    "PROVIDERS",
    "Backend",
    "Measurement",
    "ProfileRow",
    "ProfileReport",
    "ProfileDB",
    "MeasuredFn",
    "MeasuredSource",
    "MeasuredLookup",
    "detect_device_name",
    "measure_shards",
    "profile_graph",
    "open_measured",
]

#: Our onnxruntime provider names -> onnxruntime execution providers.
ORT_PROVIDERS: dict[str, str] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

MeasuredFn = Callable[[Op, Mapping[str, int]], "float | tuple[float, float | None] | None"]
"""Measured seconds of an op's per-device shard under a configuration: the forward time, or
``(forward, backward)`` where the backward was measured too; ``None`` when not in the database."""

APPLICATION_ID = 0x504C4E52
"""``PRAGMA application_id`` of a planner profile database ("PLNR")."""
SCHEMA_VERSION = "2"
"""Layout written by this planner (1: no application id, no backward times, no claims)."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS timings (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    median_s REAL NOT NULL,
    repeats INTEGER NOT NULL,
    spread_s REAL NOT NULL,
    measured_dtypes TEXT NOT NULL,
    method TEXT NOT NULL,
    description TEXT NOT NULL,
    created_unix REAL NOT NULL,
    backward_median_s REAL,
    backward_spread_s REAL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS failures (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    reason TEXT NOT NULL,
    description TEXT NOT NULL,
    created_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID;
"""
_CLAIMS = """
CREATE TABLE IF NOT EXISTS claims (
    signature TEXT NOT NULL,
    provider TEXT NOT NULL,
    device_name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    claimed_unix REAL NOT NULL,
    PRIMARY KEY (signature, provider, device_name)
) WITHOUT ROWID
"""
_V1_TABLES = frozenset({"meta", "timings", "failures"})
_TIMING_COLUMNS = (
    "signature",
    "provider",
    "device_name",
    "median_s",
    "repeats",
    "spread_s",
    "measured_dtypes",
    "method",
    "description",
    "created_unix",
    "backward_median_s",
    "backward_spread_s",
)
_FAMILY_CHUNK = 16
"""Shards per onnxruntime session at most, so one profiler trace stays small."""
_CLAIM_BATCH = 4
"""Shards claimed at once: small, so two processes share a model's shards evenly."""
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRow:
    """One row of the ``timings`` table."""

    signature: str
    provider: str
    device_name: str
    median_s: float
    repeats: int
    spread_s: float
    measured_dtypes: str
    method: str
    description: str
    created_unix: float
    """When it was measured (seconds since the Unix epoch)."""
    backward_median_s: float | None = None
    """Median backward seconds; ``None``: not measured (the cost model scales the forward)."""
    backward_spread_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileReport:
    """What :func:`profile_graph` did."""

    provider: str
    device_name: str
    configs: int
    """Distinct (op, split factors) pairs considered."""
    shards: int
    """Distinct shard signatures among them."""
    measured: int
    """Signatures measured by this call."""
    cached: int
    """Signatures already timed in the database (skipped)."""
    failed: int
    """Signatures that cannot run here (now, or recorded by an earlier run)."""
    pending: int
    """Signatures left unmeasured because of ``max_shards``."""
    unprofilable_configs: int
    """Configurations with no timing: the op has no mapping, or it failed to run."""
    unprofilable_by_type: Mapping[str, int] = field(default_factory=dict)
    """Op type -> unprofilable configurations."""
    examples: tuple[str, ...] = ()
    """A few reasons, ``"op: reason"``."""
    elsewhere: int = 0
    """Signatures another process claimed while this one ran (measured there, or still being
    measured there when this call ended): not measured here."""
    measured_signatures: tuple[str, ...] = ()
    """The signatures this call measured, in order."""
    dtype: str = ""
    """torch providers: the dtype the calls ran in; onnxruntime: ``""`` (the model's dtypes)."""
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready values (``planner profile --json``); signatures as a count."""
        return {
            "provider": self.provider,
            "device_name": self.device_name,
            "dtype": self.dtype,
            "configs": self.configs,
            "shards": self.shards,
            "measured": self.measured,
            "measured_elsewhere": self.elsewhere,
            "cached": self.cached,
            "failed": self.failed,
            "pending": self.pending,
            "unprofilable_configs": self.unprofilable_configs,
            "unprofilable_by_type": dict(self.unprofilable_by_type),
            "examples": list(self.examples),
            "elapsed_s": self.elapsed_s,
        }

    def summary(self) -> str:
        """One line for the CLI."""
        elsewhere = f"{self.elsewhere} by another process at the same time, " if self.elsewhere else ""
        return (
            f"{self.shards} distinct shards over {self.configs} configurations: {self.measured} measured, "
            f"{elsewhere}{self.cached} already in the database, {self.failed} failed, {self.pending} left; "
            f"{self.unprofilable_configs} configurations unprofilable ({self.elapsed_s:.1f} s, "
            f"{self.provider}{' ' + self.dtype if self.dtype else ''} on {self.device_name})"
        )


# --------------------------------------------------------------------------------------------------
# Device names and providers.


def detect_device_name(provider: str = "cpu") -> str:
    """A stable name of the hardware a provider runs on, part of every database key.

    CPU (``cpu``, ``torch-cpu``): the ``model name`` from ``/proc/cpuinfo`` (else
    :func:`platform.processor`) and the core count; ``cuda``: the first GPU's name from ``nvidia-smi``
    (else ``"cuda:0"``); ``torch-cuda``: ``torch.cuda.get_device_name()``.

    Examples
    --------
    >>> detect_device_name("cpu").endswith("cores)")
    True
    """
    if provider == "torch-cuda":
        return torch_profile.torch_device_name("cuda")
    if provider == "cuda":
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            name = done.stdout.strip().splitlines()[0].strip()
            if name:
                return name
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
        return "cuda:0"
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    return f"{model} ({os.cpu_count() or 1} cores)"


def _check_ort_provider(provider: str) -> str:
    """The onnxruntime provider for ``provider``; InputError when unknown or not in this build."""
    if provider not in ORT_PROVIDERS:
        raise InputError(f"unknown provider '{provider}'; use one of: {', '.join(PROVIDERS)}")
    import onnxruntime as ort

    name = ORT_PROVIDERS[provider]
    available = ort.get_available_providers()
    if name not in available:
        raise InputError(
            f"provider '{provider}' ({name}) is not available in this onnxruntime build "
            f"(available: {', '.join(available)}); install onnxruntime-gpu or use --provider cpu"
        )
    return name


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


def measure_shards(
    specs: Sequence[ShardSpec],
    *,
    provider: str = "cpu",
    repeats: int = 10,
    warmup: int = 2,
    time_budget_s: float = 2.0,
    progress: Callable[[int, int], None] | None = None,
) -> list[Measurement | str]:
    """Time shards with onnxruntime (see the module docstring for how).

    Parameters
    ----------
    specs:
        Shards from :func:`objectives.onnx_build.shard_spec`.
    provider:
        ``"cpu"`` or ``"cuda"``.
    repeats:
        Timed runs per shard (fewer for a shard whose run exceeds ``time_budget_s / repeats``;
        at least one).
    warmup:
        Runs before timing; the first also checks the output shapes.
    time_budget_s:
        Rough time allowed for one shard's warm-up and timed runs (seconds).
    progress:
        Called with (shards done, shards in all) after each batch.

    Returns
    -------
    list[Measurement | str]
        Per shard, in order: its timing or why it could not run.

    Raises
    ------
    InputError
        Unknown provider, or one this onnxruntime build lacks.
    """
    _check_ort_provider(provider)
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup}); fix the values")
    results: list[Measurement | str | None] = [None] * len(specs)
    families: dict[str, list[int]] = {}
    for index, spec in enumerate(specs):
        families.setdefault(spec.model_key, []).append(index)
    done = 0
    workdir = tempfile.mkdtemp(prefix="planner-profile-")
    try:
        for members in families.values():
            for start in range(0, len(members), _FAMILY_CHUNK):
                chunk = members[start : start + _FAMILY_CHUNK]
                measured = _measure_family(
                    [specs[i] for i in chunk],
                    provider=provider,
                    repeats=repeats,
                    warmup=warmup,
                    time_budget_s=time_budget_s,
                    workdir=workdir,
                )
                for i, result in zip(chunk, measured):
                    results[i] = result
                done += len(chunk)
                if progress is not None:
                    progress(done, len(specs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return [r if r is not None else "not measured" for r in results]


# --------------------------------------------------------------------------------------------------
# Providers: how each maps a configuration to a shard and times shards.


@dataclass(frozen=True, slots=True, kw_only=True)
class _Shard:
    """One distinct shard as a provider runs it."""

    key: str
    """Database signature."""
    family: str
    """Shards of one family are measured together (onnxruntime: one session)."""
    op_type: str
    op_name: str
    description: str
    bytes: int
    """Memory one run needs, roughly (bytes): shards over the limit are skipped."""
    payload: object
    """What the backend runs: a :class:`ShardSpec` or a :class:`~objectives.torch_profile.TorchCall`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Timing:
    """Knobs of one measuring call, the same for every provider."""

    repeats: int
    warmup: int
    time_budget_s: float
    flush: bool
    dtype: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """What a provider needs to profile: a check, its device, shards and a timer."""

    name: str
    description: str
    check: Callable[[], None]
    """Raises :class:`InputError` (with the fix) when the provider cannot run here."""
    device_name: Callable[[], str]
    default_dtype: str
    """dtype the calls run in unless told (``""``: the model's own dtypes, not selectable)."""
    shard: Callable[[Op, Mapping[str, int], Mapping[str, Tensor], str], "_Shard | str"]
    """``(op, factors, tensors, dtype) -> shard`` or why the configuration has none."""
    measure: Callable[[str, Sequence[_Shard], _Timing], "list[Measurement | str]"]
    """``(provider, shards, timing) -> per shard its timing or why it could not run``."""
    memory_bytes: Callable[[], int]
    """Default limit on one shard's memory (bytes)."""
    needs_tensors: bool = False
    """Looking a shard up needs the graph's tensors (``ProfileDB.lookup_fn(tensors=...)``)."""


def _physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def _shard_bytes(spec: ShardSpec) -> int:
    total = spec.input_bytes
    for out in spec.outputs:
        if out.shape is not None and out.dtype:
            itemsize = 4 if out.dtype in FLOAT32_FALLBACK else np.dtype(
                bool if out.dtype == "bool" else out.dtype
            ).itemsize
            total += int(np.prod(out.shape, dtype=np.int64)) * itemsize
    return total


def _ort_shard(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor], dtype: str) -> _Shard | str:
    spec = shard_spec_or_reason(op, factors)
    if isinstance(spec, str):
        return spec
    return _Shard(key=spec.key, family=spec.model_key, op_type=spec.op_type, op_name=spec.op_name,
                  description=spec.description, bytes=_shard_bytes(spec), payload=spec)


def _ort_measure(provider: str, shards: Sequence[_Shard], timing: _Timing) -> list[Measurement | str]:
    return measure_shards([s.payload for s in shards], provider=provider, repeats=timing.repeats,  # type: ignore[misc]
                          warmup=timing.warmup, time_budget_s=timing.time_budget_s)


def _ort_backend(provider: str) -> Backend:
    return Backend(
        name=provider,
        description=f"onnxruntime {ORT_PROVIDERS[provider]}, forward only",
        check=lambda: (_check_ort_provider(provider), None)[1],
        device_name=lambda: detect_device_name(provider),
        default_dtype="",
        shard=_ort_shard,
        measure=_ort_measure,
        memory_bytes=lambda: _physical_memory_bytes() // 4,
    )


_HALF_DTYPES = frozenset({"bfloat16", "float16"})


def _torch_shard(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor], dtype: str) -> _Shard | str:
    call = torch_profile.torch_call(op, factors, tensors=tensors)
    if isinstance(call, str):
        return call
    itemsize = 2 if dtype in _HALF_DTYPES else 4
    return _Shard(
        key=torch_profile.call_signature(call, dtype),
        family=call.fn,
        op_type=op.op_type,
        op_name=op.name,
        description=f"{call.describe()} {dtype}",
        # inputs, their gradients, the retained forward's outputs and the output gradients
        bytes=4 * call.elements * itemsize,
        payload=call,
    )


def _stats(times: Sequence[float]) -> tuple[float, float]:
    """Median (at least 1 ns: a zero would read as "free") and interquartile range, seconds."""
    q25, median, q75 = np.percentile(np.asarray(times, dtype=np.float64), [25, 50, 75])
    return max(float(median), 1e-9), float(q75 - q25)


def _torch_measure(provider: str, shards: Sequence[_Shard], timing: _Timing) -> list[Measurement | str]:
    device = provider.removeprefix("torch-")
    results: list[Measurement | str] = []
    for shard in shards:
        timed = torch_profile.measure_call(
            shard.payload,  # type: ignore[arg-type]
            device=device, dtype=timing.dtype, repeats=timing.repeats, warmup=timing.warmup,
            flush=timing.flush, time_budget_s=timing.time_budget_s,
        )
        if isinstance(timed, str):
            results.append(timed)
            continue
        forward, forward_spread = _stats(timed.forward_s)
        backward, backward_spread = _stats(timed.backward_s) if timed.backward_s else (None, None)
        results.append(
            Measurement(median_s=forward, repeats=len(timed.forward_s), spread_s=forward_spread,
                        measured_dtypes=timing.dtype, method=timed.method, backward_median_s=backward,
                        backward_spread_s=backward_spread)
        )
    return results


def _torch_memory_bytes(device: str) -> int:
    if device == "cuda":  # most of a GPU is free for one call; leave room for the allocator's cache
        return int(torch_profile.require_torch().cuda.get_device_properties(0).total_memory) // 2
    return _physical_memory_bytes() // 4


def _torch_backend(device: str) -> Backend:
    return Backend(
        name=f"torch-{device}",
        description=f"PyTorch on {device}, forward and backward",
        check=lambda: torch_profile.check_device(device),
        device_name=lambda: torch_profile.torch_device_name(device),
        default_dtype="bfloat16" if device == "cuda" else "float32",
        shard=_torch_shard,
        measure=_torch_measure,
        memory_bytes=lambda: _torch_memory_bytes(device),
        needs_tensors=True,
    )


#: Provider name -> backend. onnxruntime: ``cpu``, ``cuda``; PyTorch: ``torch-cpu``, ``torch-cuda``.
PROVIDERS: dict[str, Backend] = {
    "cpu": _ort_backend("cpu"),
    "cuda": _ort_backend("cuda"),
    "torch-cpu": _torch_backend("cpu"),
    "torch-cuda": _torch_backend("cuda"),
}


def _backend(provider: str) -> Backend:
    backend = PROVIDERS.get(provider)
    if backend is None:
        raise InputError(f"unknown provider '{provider}'; use one of: {', '.join(PROVIDERS)}")
    return backend


# --------------------------------------------------------------------------------------------------
# The database.


class _Foreign(Exception):
    """The file is an SQLite database that is not ours (the message says what it holds)."""


def _alive(host: str, pid: int) -> bool:
    """False only when the claiming process is known to be gone (same host, no such pid)."""
    if host != socket.gethostname():
        return True  # cannot tell: the claim's age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class ProfileDB:
    """Timings keyed by (shard signature, provider, device name), in one SQLite file.

    Safe for several processes at once (WAL journal, busy timeout, ``INSERT OR IGNORE`` in short
    transactions, claims for the work in progress). Open one per process; use as a context manager
    or call :meth:`close`.

    Parameters
    ----------
    path:
        The database file; created (with its folder) when missing and ``create``.
    timeout_s:
        How long to wait for another process's write lock (seconds).
    create:
        Create the file when it does not exist; else a missing file is an :class:`InputError`
        (reading timings for a plan).

    Raises
    ------
    InputError
        The file is missing (``create=False``), not an SQLite database, an SQLite database that is
        not a planner profile database (refused before anything is written to it), or one written
        by a newer planner.

    Examples
    --------
    >>> import tempfile, os
    >>> with ProfileDB(os.path.join(tempfile.mkdtemp(), "p.db")) as db:
    ...     db.timings(provider="cpu", device_name="test")
    {}
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 60.0, create: bool = True) -> None:
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise InputError(
                    f"no profile database at {self.path}; run `planner profile MODEL --profile-db {self.path}` first"
                )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(
                    f"cannot create folder for profile database {self.path}: {exc}; choose another path"
                ) from None
        elif not self.path.is_file():
            raise InputError(f"profile database {self.path} is not a regular file; choose another path")
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            # reading the header and the schema writes nothing: a foreign file is left as it was
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            if self._identify(self._conn) != "current":
                self._write(self._create_or_upgrade)
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch journal to WAL (got {mode})")
            self._conn.execute("PRAGMA synchronous = NORMAL")  # durable enough with WAL, much faster
            columns = [row[1] for row in self._conn.execute("PRAGMA table_info(timings)")]
        except _Foreign as exc:
            self._conn.close()
            raise InputError(f"{self.path} {exc}; choose another path (the file was left unchanged)") from None
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc) from None
        if tuple(columns) != _TIMING_COLUMNS:
            self._conn.close()
            raise InputError(
                f"profile database {self.path} has another layout (timings columns {', '.join(columns)}); "
                "delete it or choose another path"
            )
        self._token = uuid.uuid4().hex
        self._host = socket.gethostname()

    # -- plumbing

    def _error(self, exc: BaseException) -> InputError:
        return InputError(
            f"profile database {self.path} is unreadable ({_first_line(exc)}); if it is a planner profile "
            "database delete it, or choose another path"
        )

    @staticmethod
    def _identify(conn: sqlite3.Connection) -> Literal["current", "empty", "v1"]:
        """What the file holds; :class:`_Foreign` when it is another program's database."""
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
            if not name.startswith("sqlite_")
        }
        if application_id == APPLICATION_ID:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if version is None or version[0] != SCHEMA_VERSION:
                found = version[0] if version else "?"
                if found.isdigit() and int(found) > int(SCHEMA_VERSION):
                    raise _Foreign(
                        f"is a profile database of a newer planner (layout {found}, this one reads {SCHEMA_VERSION}); "
                        "upgrade planner"
                    )
                raise _Foreign(f"is a profile database of unknown layout {found}")
            return "current"
        if application_id == 0 and not tables:
            return "empty"  # a new file (or an SQLite file with nothing in it)
        if application_id == 0 and tables == _V1_TABLES:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if version is not None and version[0] == "1":
                return "v1"
        what = f"application id {application_id:#x}" if application_id else f"tables {', '.join(sorted(tables))}"
        raise _Foreign(f"is an SQLite database but not a planner profile database ({what})")

    @classmethod
    def _create_or_upgrade(cls, conn: sqlite3.Connection) -> None:
        """In the write transaction: create the layout, or upgrade a version-1 file."""
        state = cls._identify(conn)  # again: another process may have created it meanwhile
        if state == "current":
            return
        if state == "v1":
            conn.execute("ALTER TABLE timings ADD COLUMN backward_median_s REAL")
            conn.execute("ALTER TABLE timings ADD COLUMN backward_spread_s REAL")
        else:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(_CLAIMS)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _write(self, body: Callable[[sqlite3.Connection], object]) -> object:
        """Run ``body`` in one short write transaction (taken at once, so it never deadlocks)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> ProfileDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reading

    def timings(self, *, provider: str, device_name: str) -> dict[str, float]:
        """Signature -> median forward seconds, for one provider and device (one SELECT)."""
        rows = self._query(
            "SELECT signature, median_s FROM timings WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return {signature: float(median) for signature, median in rows}

    def timings_with_backward(self, *, provider: str, device_name: str) -> dict[str, tuple[float, float | None]]:
        """Signature -> (median forward seconds, median backward seconds or ``None``)."""
        rows = self._query(
            "SELECT signature, median_s, backward_median_s FROM timings WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return {s: (float(f), None if b is None else float(b)) for s, f, b in rows}

    def failures(self, *, provider: str, device_name: str) -> dict[str, str]:
        """Signature -> reason, for shards recorded as unable to run on this provider and device."""
        rows = self._query(
            "SELECT signature, reason FROM failures WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return dict(rows)

    def sources(self) -> list[tuple[str, str, str, int]]:
        """``(provider, device_name, dtypes, timings)`` of every group of timings, most timings first."""
        rows = self._query(
            "SELECT provider, device_name, measured_dtypes, COUNT(*) FROM timings "
            "GROUP BY provider, device_name, measured_dtypes"
        )
        merged: dict[tuple[str, str], tuple[Counter[str], int]] = {}
        for provider, device, dtypes, count in rows:
            seen, total = merged.get((provider, device), (Counter(), 0))
            seen.update({d: count for d in str(dtypes).split(",") if d})
            merged[(provider, device)] = (seen, total + int(count))
        out = [(p, d, ",".join(sorted(seen)), total) for (p, d), (seen, total) in merged.items()]
        return sorted(out, key=lambda s: (-s[3], s[0], s[1]))

    def rows(self) -> list[ProfileRow]:
        """Every timing, ordered by signature, provider and device."""
        rows = self._query(
            f"SELECT {', '.join(_TIMING_COLUMNS)} FROM timings ORDER BY signature, provider, device_name"
        )
        return [ProfileRow(**dict(zip(_TIMING_COLUMNS, row))) for row in rows]

    def integrity_ok(self) -> bool:
        """True when SQLite's ``PRAGMA integrity_check`` finds nothing wrong."""
        return self._query("PRAGMA integrity_check") == [("ok",)]

    # -- writing

    def record(self, rows: Iterable[ProfileRow]) -> int:
        """Insert timings in one transaction; rows whose key exists are kept as they are.

        Also drops this process's claims on the inserted signatures. Returns the number of rows
        inserted.
        """
        rows = list(rows)
        values = [tuple(getattr(row, c) for c in _TIMING_COLUMNS) for row in rows]
        if not values:
            return 0
        columns = ", ".join(_TIMING_COLUMNS)
        sql = f"INSERT OR IGNORE INTO timings ({columns}) VALUES ({', '.join('?' * len(_TIMING_COLUMNS))})"

        def insert(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(sql, values)
            inserted = conn.total_changes - before
            self._release(conn, [(r.signature, r.provider, r.device_name) for r in rows])
            return inserted

        try:
            return int(self._write(insert))  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def record_failures(
        self, failures: Iterable[tuple[str, str, str]], *, provider: str, device_name: str
    ) -> None:
        """Insert (signature, reason, description) of shards that cannot run here, in one transaction."""
        now = time.time()
        values = [(s, provider, device_name, reason, desc, now) for s, reason, desc in failures]
        if not values:
            return
        sql = (
            "INSERT OR IGNORE INTO failures (signature, provider, device_name, reason, description, created_unix)"
            " VALUES (?, ?, ?, ?, ?, ?)"
        )

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany(sql, values)
            self._release(conn, [(v[0], provider, device_name) for v in values])

        try:
            self._write(insert)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    # -- claims: who measures what when several processes profile into one file

    def _release(self, conn: sqlite3.Connection, keys: Sequence[tuple[str, str, str]]) -> None:
        conn.executemany(
            "DELETE FROM claims WHERE signature = ? AND provider = ? AND device_name = ? AND token = ?",
            [(*key, self._token) for key in keys],
        )

    def claim(
        self, signatures: Sequence[str], *, provider: str, device_name: str, claim_timeout_s: float = 3600.0
    ) -> tuple[list[str], list[str]]:
        """Claim shards to measure, in one transaction.

        A signature is claimed unless it is already timed or failed, or claimed by another live
        process (a claim older than ``claim_timeout_s`` seconds, or whose process is gone from this
        host, is taken over).

        Returns
        -------
        (mine, done_or_taken)
            Signatures this process now holds; the others (timed, failed, or claimed elsewhere).
        """
        now = time.time()
        pid = os.getpid()

        def take(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
            mine: list[str] = []
            other: list[str] = []
            for signature in signatures:
                key = (signature, provider, device_name)
                where = "signature = ? AND provider = ? AND device_name = ?"
                done = conn.execute(
                    f"SELECT 1 FROM timings WHERE {where} UNION ALL SELECT 1 FROM failures WHERE {where}", key + key
                ).fetchone()
                if done is not None:
                    other.append(signature)
                    continue
                held = conn.execute(f"SELECT host, pid, token, claimed_unix FROM claims WHERE {where}", key).fetchone()
                if held is not None:
                    host, owner, token, claimed = held
                    if token != self._token and now - claimed < claim_timeout_s and _alive(host, owner):
                        other.append(signature)
                        continue
                conn.execute(
                    "INSERT OR REPLACE INTO claims (signature, provider, device_name, host, pid, token, claimed_unix)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    key + (self._host, pid, self._token, now),
                )
                mine.append(signature)
            return mine, other

        try:
            return self._write(take)  # type: ignore[return-value]
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def release_claims(self) -> None:
        """Drop every claim this connection still holds (a run stopped before measuring them)."""
        try:
            self._write(lambda conn: conn.execute("DELETE FROM claims WHERE token = ?", (self._token,)))
        except sqlite3.Error:
            pass  # best effort: the claims expire, and a dead process's claims are taken over at once

    def claimed_elsewhere(self, signatures: Iterable[str], *, provider: str, device_name: str) -> set[str]:
        """Of ``signatures``, those held now by another process's live claim."""
        rows = self._query(
            "SELECT signature, host, pid FROM claims WHERE provider = ? AND device_name = ? AND token != ?",
            (provider, device_name, self._token),
        )
        wanted = set(signatures)
        return {s for s, host, pid in rows if s in wanted and _alive(host, pid)}

    # -- for the cost model

    def lookup_fn(
        self,
        provider: str = "cpu",
        device_name: str | None = None,
        *,
        tensors: Mapping[str, Tensor] | None = None,
        dtype: str | None = None,
    ) -> MeasuredFn:
        """A function giving the measured seconds of ``(op, factors)``, ``None`` if absent.

        The timings of this provider and device are read once, now; the returned function rebuilds
        the shard's signature and looks it up. It returns the forward seconds, or
        ``(forward, backward)`` where the backward was measured too (torch providers).

        Parameters
        ----------
        provider:
            A key of :data:`PROVIDERS`.
        device_name:
            The device the timings were taken on; default: this machine's
            (:func:`detect_device_name`).
        tensors:
            The graph's tensors (:func:`objectives.torch_profile.tensor_view`); needed by torch
            providers, whose signature is the PyTorch call the op maps to.
        dtype:
            torch providers: the dtype the calls ran in (default: the provider's).

        Raises
        ------
        InputError
            Unknown provider, or a torch provider without ``tensors``.
        """
        backend = _backend(provider)
        device = device_name or detect_device_name(provider)
        table = self.timings_with_backward(provider=provider, device_name=device)
        if backend.needs_tensors and tensors is None:
            raise InputError(f"looking up {provider} timings needs the graph's tensors; pass tensors=")
        chosen = dtype or backend.default_dtype

        def measured(op: Op, factors: Mapping[str, int]) -> float | tuple[float, float | None] | None:
            if not table:
                return None
            if backend.needs_tensors:
                shard = backend.shard(op, factors, tensors or {}, chosen)
                if isinstance(shard, str):
                    return None
                key = shard.key
            else:
                if op.node is None:
                    return None
                spec = shard_spec(op, factors)
                if spec is None:
                    return None
                key = spec.key
            found = table.get(key)
            if found is None:
                return None
            return found[0] if found[1] is None else found

        return measured


# --------------------------------------------------------------------------------------------------
# The whole graph.


def _checked_dtype(
    backend: Backend, provider: str, dtype: str | None, *, graph: OpGraph, config_spaces: Sequence[ConfigSpace],
    repeats: int, warmup: int,
) -> str:
    """The dtype the calls run in (``""``: an onnxruntime provider's model dtypes), once the
    arguments of :func:`profile_graph` and the provider (:attr:`Backend.check`) pass their checks."""
    if dtype is not None and not backend.default_dtype:
        raise InputError(f"provider '{provider}' runs the model's own dtypes; a dtype applies to torch providers only")
    if dtype is not None and dtype not in torch_profile.TORCH_DTYPES:
        raise InputError(f"cannot time torch calls in '{dtype}'; use one of: {', '.join(torch_profile.TORCH_DTYPES)}")
    chosen = dtype or backend.default_dtype
    backend.check()
    if len(config_spaces) != len(graph.ops):
        raise InputError(
            f"got {len(config_spaces)} config spaces for {len(graph.ops)} ops; pass one per op of the graph"
        )
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup}); fix the values")
    return chosen


@dataclass(frozen=True, slots=True, kw_only=True)
class _GraphShards:
    """The distinct shards of a graph's configurations (:func:`_graph_shards`)."""

    shards: dict[str, _Shard]
    """Signature -> shard, first seen first."""
    config_keys: list[str]
    """Per profilable configuration, its shard's signature."""
    configs: int
    """Configurations looked at (rows differing only in node placement once)."""
    unprofilable: int
    """Configurations with no shard."""
    by_type: Counter[str]
    """Unprofilable configurations per op type."""


def _graph_shards(
    graph: OpGraph, config_spaces: Sequence[ConfigSpace], backend: Backend, tensors: Mapping[str, Tensor], dtype: str,
    examples: list[str],
) -> _GraphShards:
    """Every configuration's shard, deduplicated by signature; the first reasons a configuration has
    none are added to ``examples`` (up to 5)."""
    shards: dict[str, _Shard] = {}
    config_keys: list[str] = []
    configs = 0
    unprofilable = 0
    by_type: Counter[str] = Counter()
    for op, space in zip(graph.ops, config_spaces):
        for row in np.unique(space.factors, axis=0):  # rows differing only in node placement: once
            configs += 1
            factors = dict(zip(space.dim_names, (int(f) for f in row)))
            result = backend.shard(op, factors, tensors, dtype)
            if isinstance(result, str):
                unprofilable += 1
                by_type[op.op_type] += 1
                if len(examples) < 5:
                    examples.append(f"{op.name}: {result}")
                continue
            shards.setdefault(result.key, result)
            config_keys.append(result.key)
    return _GraphShards(shards=shards, config_keys=config_keys, configs=configs, unprofilable=unprofilable,
                        by_type=by_type)


@dataclass(frozen=True, slots=True, kw_only=True)
class _ToMeasure:
    """Which shards a :func:`profile_graph` call measures (:func:`_to_measure`)."""

    todo: list[_Shard]
    """Not yet timed nor failed here, within the memory limit, at most ``max_shards``."""
    cached: int
    """Shards the database already times."""
    failed_keys: set[str]
    """Shards that failed before, or are over the memory limit (the call adds its own failures)."""
    pending: int
    """Shards left for a later run by ``max_shards``."""


def _to_measure(
    shards: Mapping[str, _Shard], db: ProfileDB, *, provider: str, device: str, limit: int, max_shards: int | None,
    examples: list[str],
) -> _ToMeasure:
    """The shards still to time on ``device``; the first shards over ``limit`` are added to ``examples``."""
    timed = db.timings(provider=provider, device_name=device)
    known_failures = db.failures(provider=provider, device_name=device)
    cached = sum(1 for key in shards if key in timed)
    todo = [s for key, s in shards.items() if key not in timed and key not in known_failures]
    failed_keys = {key for key in shards if key in known_failures}
    for shard in todo:
        if shard.bytes > limit:  # not recorded: another machine or limit may run it
            failed_keys.add(shard.key)
            if len(examples) < 5:
                examples.append(f"{shard.op_name}: shard needs {shard.bytes} bytes, over {limit}")
    todo = [s for s in todo if s.bytes <= limit]
    pending = 0
    if max_shards is not None and len(todo) > max_shards:
        pending = len(todo) - max_shards
        todo = todo[: max(max_shards, 0)]
    return _ToMeasure(todo=todo, cached=cached, failed_keys=failed_keys, pending=pending)


class _Measuring:
    """Claims, measures and records batches of shards for one :func:`profile_graph` call.

    Mutable on purpose: it gathers what the batches found (measured signatures, failures, shards
    another process held) across the claim rounds, in the order they ran."""

    __slots__ = ("db", "backend", "provider", "device", "timing", "claim_timeout_s", "examples", "failed_keys",
                 "measured_keys", "deferred")

    def __init__(self, db: ProfileDB, backend: Backend, *, provider: str, device: str, timing: _Timing,
                 claim_timeout_s: float, examples: list[str], failed_keys: set[str]) -> None:
        self.db, self.backend, self.provider, self.device = db, backend, provider, device
        self.timing, self.claim_timeout_s = timing, claim_timeout_s
        self.examples, self.failed_keys = examples, failed_keys
        self.measured_keys: list[str] = []
        self.deferred: list[_Shard] = []  # shards another process had claimed

    def run(self, batch: Sequence[_Shard]) -> None:
        """Claim ``batch``, measure the shards this process holds, record them in one transaction."""
        db, provider, device, examples = self.db, self.provider, self.device, self.examples
        mine, _ = db.claim([s.key for s in batch], provider=provider, device_name=device,
                           claim_timeout_s=self.claim_timeout_s)
        held = set(mine)
        self.deferred.extend(s for s in batch if s.key not in held)
        chunk = [s for s in batch if s.key in held]
        if not chunk:
            return
        results = self.backend.measure(provider, chunk, self.timing)
        now = time.time()
        rows = []
        failures = []
        for shard, result in zip(chunk, results):
            if isinstance(result, str):
                failures.append((shard.key, result, shard.description))
                self.failed_keys.add(shard.key)
                if len(examples) < 5:
                    examples.append(f"{shard.op_name}: {result}")
                continue
            rows.append(
                ProfileRow(
                    signature=shard.key,
                    provider=provider,
                    device_name=device,
                    median_s=result.median_s,
                    repeats=result.repeats,
                    spread_s=result.spread_s,
                    measured_dtypes=result.measured_dtypes,
                    method=result.method,
                    description=shard.description,
                    created_unix=now,
                    backward_median_s=result.backward_median_s,
                    backward_spread_s=result.backward_spread_s,
                )
            )
        db.record(rows)  # one short transaction per batch: a killed run keeps what it measured
        db.record_failures(failures, provider=provider, device_name=device)
        self.measured_keys.extend(row.signature for row in rows)

    def measure_all(self, todo: Sequence[_Shard], progress: Callable[[int, int], None] | None) -> list[_Shard]:
        """Measure ``todo`` family by family, then the shards another process claimed and left
        behind; returns those still measured elsewhere (or done there meanwhile)."""
        db, provider, device = self.db, self.provider, self.device
        done = 0
        families: dict[str, list[_Shard]] = {}
        for shard in todo:
            families.setdefault(shard.family, []).append(shard)
        try:
            for members in families.values():
                for start in range(0, len(members), _CLAIM_BATCH):
                    batch = members[start : start + _CLAIM_BATCH]
                    self.run(batch)
                    done += len(batch)
                    if progress is not None:
                        progress(done, len(todo))
            # Shards another process claimed: measured there by now, still in its hands, or left
            # behind (it stopped before recording them): those are measured here.
            skipped, self.deferred = self.deferred, []
            if skipped:
                finished = set(db.timings(provider=provider, device_name=device)) | set(
                    db.failures(provider=provider, device_name=device)
                )
                busy = db.claimed_elsewhere([s.key for s in skipped], provider=provider, device_name=device)
                orphans = [s for s in skipped if s.key not in finished and s.key not in busy]
                for start in range(0, len(orphans), _CLAIM_BATCH):
                    self.run(orphans[start : start + _CLAIM_BATCH])
                skipped = [s for s in skipped if s.key not in set(self.measured_keys)]
        finally:
            db.release_claims()
        return skipped


def profile_graph(
    graph: OpGraph,
    config_spaces: Sequence[ConfigSpace],
    db: ProfileDB,
    *,
    provider: str = "cpu",
    repeats: int = 10,
    warmup: int = 2,
    progress: Callable[[int, int], None] | None = None,
    max_shards: int | None = None,
    device_name: str | None = None,
    time_budget_s: float = 2.0,
    max_shard_bytes: int | None = None,
    dtype: str | None = None,
    flush: bool = True,
    claim_timeout_s: float = 3600.0,
) -> ProfileReport:
    """Measure every distinct per-device shard of every op over the given configurations.

    Parameters
    ----------
    graph:
        The model.
    config_spaces:
        One :class:`~planner.core.configs.ConfigSpace` per op of ``graph.ops``, in order.
    db:
        Where timings are read from and written to (each batch in its own transaction).
    provider:
        A key of :data:`PROVIDERS`: ``cpu``/``cuda`` (onnxruntime), ``torch-cpu``/``torch-cuda``.
    repeats, warmup, time_budget_s:
        Timed runs per shard (fewer when a run is slow: about ``time_budget_s`` seconds per shard),
        untimed runs before them.
    progress:
        Called with (shards done, shards to measure) as measuring proceeds.
    max_shards:
        Measure at most this many new shards (the rest are ``pending``; run again to go on).
    device_name:
        Key of this hardware in the database; default: the provider's device name.
    max_shard_bytes:
        Skip shards needing more memory than this (bytes; default: a quarter of this machine's
        memory, half the GPU's for ``torch-cuda``).
    dtype:
        torch providers: ``bfloat16`` (default on CUDA), ``float32`` (default on CPU) or ``float16``.
    flush:
        ``torch-cuda``: flush the L2 cache before each timed run.
    claim_timeout_s:
        Another process's claim older than this (seconds) is taken over (it died on another host).

    Returns
    -------
    ProfileReport
        Counts: measured now, measured by another process meanwhile, already in the database,
        failed, pending, unprofilable configurations; and the signatures measured now.

    Raises
    ------
    InputError
        Unknown or unavailable provider (torch missing, no GPU), a config space per op missing,
        bad repeats/warmup, a dtype for an onnxruntime provider.
    """
    started = time.perf_counter()
    backend = _backend(provider)
    chosen = _checked_dtype(backend, provider, dtype, graph=graph, config_spaces=config_spaces, repeats=repeats,
                            warmup=warmup)
    device = device_name or backend.device_name()
    limit = max_shard_bytes if max_shard_bytes is not None else backend.memory_bytes()
    tensors = torch_profile.tensor_view(graph) if backend.needs_tensors else graph.tensors

    examples: list[str] = []
    found = _graph_shards(graph, config_spaces, backend, tensors, chosen, examples)
    shards, config_keys, unprofilable, by_type = found.shards, found.config_keys, found.unprofilable, found.by_type

    plan = _to_measure(shards, db, provider=provider, device=device, limit=limit, max_shards=max_shards,
                       examples=examples)
    todo, failed_keys = plan.todo, plan.failed_keys
    timing = _Timing(repeats=repeats, warmup=warmup, time_budget_s=time_budget_s, flush=flush, dtype=chosen)
    measuring = _Measuring(db, backend, provider=provider, device=device, timing=timing,
                           claim_timeout_s=claim_timeout_s, examples=examples, failed_keys=failed_keys)
    skipped = measuring.measure_all(todo, progress)
    measured_keys = measuring.measured_keys
    elsewhere_failed = set(db.failures(provider=provider, device_name=device))
    failed_keys.update(shard.key for shard in skipped if shard.key in elsewhere_failed)
    elsewhere = sum(1 for shard in skipped if shard.key not in elsewhere_failed)
    unprofilable += sum(1 for op_key in config_keys if op_key in failed_keys)
    by_type.update(Counter(shards[k].op_type for k in config_keys if k in failed_keys))
    return ProfileReport(
        provider=provider,
        device_name=device,
        configs=found.configs,
        shards=len(shards),
        measured=len(measured_keys),
        cached=plan.cached,
        failed=len(failed_keys),
        pending=plan.pending,
        unprofilable_configs=unprofilable,
        unprofilable_by_type=dict(by_type),
        examples=tuple(examples),
        elsewhere=elsewhere,
        measured_signatures=tuple(measured_keys),
        dtype=chosen,
        elapsed_s=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------------------------------
# Reading timings for a plan.


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredSource:
    """One group of timings in a database: a provider on a device."""

    provider: str
    device_name: str
    dtypes: str
    """The dtypes the rows ran in, comma-separated."""
    timings: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLookup:
    """Measured times for a plan, where they come from, and what a reader should know about it."""

    fn: MeasuredFn
    source: MeasuredSource | None
    """The timings used; ``None`` when the database holds none (everything is roofline)."""
    notes: tuple[str, ...] = ()
    """One-line notes for the plan's report (another device than the cluster's, unused timings)."""


_MEMORY = re.compile(r"(\d+)\s*gb")


def same_device(profiled: str, preset: str) -> bool:
    """True when a profiled device name (``nvidia-smi``'s, torch's) is the cluster's device preset.

    The preset's chip token (its first token with a digit that is not a memory size: ``a100``,
    ``h100``, ``4090``) must appear in the profiled name, and memory sizes, where both give one,
    must agree.

    Examples
    --------
    >>> same_device("NVIDIA A100-SXM4-80GB", "a100-80gb"), same_device("NVIDIA A100-SXM4-40GB", "a100-80gb")
    (True, False)
    >>> same_device("NVIDIA H100 80GB HBM3", "h100-sxm"), same_device("AMD EPYC 7763 (2 cores)", "a100-80gb")
    (True, False)
    """
    name = profiled.lower()
    compact = re.sub(r"[^a-z0-9]", "", name)
    tokens = [t for t in re.split(r"[^a-z0-9]+", preset.lower()) if t]
    chip = next((t for t in tokens if re.search(r"\d", t) and not _MEMORY.fullmatch(t)), tokens[0] if tokens else "")
    if not chip or chip not in compact:
        return False
    preset_memory = [t for t in tokens if _MEMORY.fullmatch(t)]
    profiled_memory = _MEMORY.findall(name)
    return not (preset_memory and profiled_memory and preset_memory[0] != profiled_memory[0] + "gb")


def _no_timings(op: Op, factors: Mapping[str, int]) -> None:
    return None


def open_measured(
    path: str | os.PathLike[str],
    graph: OpGraph,
    *,
    cluster_device: str,
    precision: str = "bf16-mixed",
    provider: str | None = None,
    device_name: str | None = None,
) -> MeasuredLookup:
    """The measured times a plan on ``cluster_device`` should use from the database at ``path``.

    The database may hold timings of several providers and devices; the group used is the given
    one, else the largest whose device is the cluster's (:func:`same_device`), else the largest.
    torch rows are read in the dtype the plan computes in (``bfloat16`` for ``bf16-mixed``,
    ``float32`` for ``fp32``) when the database has it.

    Parameters
    ----------
    path:
        The profile database (must exist).
    graph:
        The model (torch rows are found through its tensors).
    cluster_device:
        Name of the cluster's device (``Device.name``, e.g. ``a100-80gb``).
    precision:
        The plan's training precision.
    provider, device_name:
        Use exactly this group of timings.

    Returns
    -------
    MeasuredLookup
        The lookup function, its source, and notes: timings from another device than the
        cluster's ("timings measured on ... not on the cluster's a100-80gb"), other groups left
        unused, an empty database.

    Raises
    ------
    InputError
        The file is missing or not a profile database; the requested provider/device has no timings.
    """
    with ProfileDB(path, create=False) as db:
        sources = [MeasuredSource(provider=p, device_name=d, dtypes=t, timings=n) for p, d, t, n in db.sources()]
        sources = [s for s in sources if s.provider in PROVIDERS]
        if provider is not None or device_name is not None:
            wanted = [
                s for s in sources
                if (provider is None or s.provider == provider) and (device_name is None or s.device_name == device_name)
            ]
            if not wanted:
                have = "; ".join(f"{s.provider} on {s.device_name}" for s in sources) or "none"
                raise InputError(
                    f"profile database {path} has no timings of {provider or 'any provider'} on "
                    f"{device_name or 'any device'} (it has: {have}); profile that device or pick one it has"
                )
            sources = wanted
        if not sources:
            return MeasuredLookup(
                fn=_no_timings,
                source=None,
                notes=(f"profile database {path} holds no timings: every op is priced by the roofline; "
                       "run `planner profile` first",),
            )
        matching = [s for s in sources if same_device(s.device_name, cluster_device)]
        chosen = (matching or sources)[0]
        backend = PROVIDERS[chosen.provider]
        notes: list[str] = []
        dtype = None
        if backend.default_dtype:
            want = "bfloat16" if precision == "bf16-mixed" else "float32"
            present = chosen.dtypes.split(",")
            dtype = want if want in present else present[0]
            if dtype != want:
                notes.append(f"timings ran in {dtype}, the plan computes in {precision}")
        fn = db.lookup_fn(
            chosen.provider, chosen.device_name,
            tensors=torch_profile.tensor_view(graph) if backend.needs_tensors else None, dtype=dtype,
        )
    if not matching:
        notes.insert(
            0,
            f"timings measured on {chosen.device_name} (provider {chosen.provider}), not on the cluster's "
            f"{cluster_device}: compute times are that device's",
        )
    others = [s for s in sources if s is not chosen]
    if others:
        notes.append(
            "unused timings in the profile database: "
            + "; ".join(f"{s.timings} of {s.provider} on {s.device_name}" for s in others)
        )
    return MeasuredLookup(fn=fn, source=chosen, notes=tuple(notes))

r"""Measured forward time of each op's per-device shard, with onnxruntime, cached in SQLite.

FlexFlow prices strategies with measured per-operator times; this module measures them on the
hardware at hand (``planner profile``) so the cost model can use them instead of the roofline.

Pipeline
--------
:func:`profile_graph` takes every configuration of every op, rebuilds the op's main ONNX node at the
per-device shard shape (:func:`objectives.onnx_build.shard_spec_or_reason`), keeps each distinct
shard signature once, skips those the :class:`ProfileDB` already holds for this provider and device
(so a second run measures nothing: resumable) and measures the rest (``_measure_family()``), writing
each small batch in its own short transaction. :meth:`ProfileDB.lookup_fn` gives the cost model a
``(op, factors) -> seconds | None`` function that reads the same signatures back.

How a shard is timed
--------------------
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
One SQLite file, table ``timings`` keyed by (signature, provider, device_name), plus ``failures``
(shards that cannot run here, so they are not retried). WAL journal, a busy timeout, and
``INSERT OR IGNORE`` in short ``BEGIN IMMEDIATE`` transactions let several processes profile into one
file at the same time without losing or corrupting rows.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

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
from planner.core.graph import Op, OpGraph

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = [
    "PROVIDERS",
    "Measurement",
    "ProfileRow",
    "ProfileReport",
    "ProfileDB",
    "MeasuredFn",
    "detect_device_name",
    "measure_shards",
    "profile_graph",
]

#: Our provider names -> onnxruntime execution providers.
PROVIDERS: dict[str, str] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

MeasuredFn = Callable[[Op, Mapping[str, int]], "float | None"]
"""Measured forward seconds of an op's per-device shard under a configuration, or ``None``."""

_SCHEMA_VERSION = "1"
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
)
_FAMILY_CHUNK = 16
"""Shards per session at most, so one profiler trace stays small."""
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
    method: Literal["profiler", "wall"]
    """``profiler``: onnxruntime's kernel time; ``wall``: wall clock of the run call."""


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
    """Configurations with no timing: the node cannot be rebuilt at the shard, or it failed to run."""
    unprofilable_by_type: Mapping[str, int] = field(default_factory=dict)
    """Op type -> unprofilable configurations."""
    examples: tuple[str, ...] = ()
    """A few reasons, ``"op: reason"``."""
    elapsed_s: float = 0.0

    def summary(self) -> str:
        """One line for the CLI."""
        return (
            f"{self.shards} distinct shards over {self.configs} configurations: {self.measured} measured, "
            f"{self.cached} already in the database, {self.failed} failed, {self.pending} left; "
            f"{self.unprofilable_configs} configurations unprofilable ({self.elapsed_s:.1f} s, "
            f"{self.provider} on {self.device_name})"
        )


# --------------------------------------------------------------------------------------------------
# Device names and providers.


def detect_device_name(provider: str = "cpu") -> str:
    """A stable name of the hardware a provider runs on, part of every database key.

    CPU: the ``model name`` from ``/proc/cpuinfo`` (else :func:`platform.processor`) and the core
    count; CUDA: the first GPU's name from ``nvidia-smi`` (else ``"cuda:0"``).

    Examples
    --------
    >>> detect_device_name("cpu").endswith("cores)")
    True
    """
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


def _check_provider(provider: str) -> str:
    """The onnxruntime provider for ``provider``; InputError when unknown or not in this build."""
    if provider not in PROVIDERS:
        raise InputError(f"unknown provider '{provider}'; use one of: {', '.join(PROVIDERS)}")
    import onnxruntime as ort

    name = PROVIDERS[provider]
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
    providers = [PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider != "cpu" else [])
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
    _check_provider(provider)
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
# The database.


class ProfileDB:
    """Timings keyed by (shard signature, provider, device name), in one SQLite file.

    Safe for several processes at once (WAL journal, busy timeout, ``INSERT OR IGNORE`` in short
    transactions). Open one per process; use as a context manager or call :meth:`close`.

    Parameters
    ----------
    path:
        The database file; created (with its folder) when missing.
    timeout_s:
        How long to wait for another process's write lock (seconds).

    Raises
    ------
    InputError
        The file is not a readable profile database.

    Examples
    --------
    >>> import tempfile, os
    >>> with ProfileDB(os.path.join(tempfile.mkdtemp(), "p.db")) as db:
    ...     db.timings(provider="cpu", device_name="test")
    {}
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(
                f"cannot create folder for profile database {self.path}: {exc}; choose another path"
            ) from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch journal to WAL (got {mode})")
            self._conn.execute("PRAGMA synchronous = NORMAL")  # durable enough with WAL, much faster
            self._write(self._create)
            version = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            columns = [row[1] for row in self._conn.execute("PRAGMA table_info(timings)")]
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc) from None
        if version is None or version[0] != _SCHEMA_VERSION or tuple(columns) != _TIMING_COLUMNS:
            self._conn.close()
            raise InputError(
                f"profile database {self.path} has another layout (schema {version[0] if version else '?'}, "
                f"this planner writes {_SCHEMA_VERSION}); delete it or choose another path"
            )

    # -- plumbing

    def _error(self, exc: BaseException) -> InputError:
        return InputError(
            f"profile database {self.path} is unreadable ({_first_line(exc)}); delete it or choose another path"
        )

    @staticmethod
    def _create(conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (_SCHEMA_VERSION,)
        )

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

    def failures(self, *, provider: str, device_name: str) -> dict[str, str]:
        """Signature -> reason, for shards recorded as unable to run on this provider and device."""
        rows = self._query(
            "SELECT signature, reason FROM failures WHERE provider = ? AND device_name = ?",
            (provider, device_name),
        )
        return dict(rows)

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

        Returns the number of rows inserted.
        """
        values = [tuple(getattr(row, c) for c in _TIMING_COLUMNS) for row in rows]
        if not values:
            return 0
        columns = ", ".join(_TIMING_COLUMNS)
        sql = f"INSERT OR IGNORE INTO timings ({columns}) VALUES ({', '.join('?' * len(_TIMING_COLUMNS))})"

        def insert(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(sql, values)
            return conn.total_changes - before

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
        try:
            self._write(lambda conn: conn.executemany(sql, values))
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    # -- for the cost model

    def lookup_fn(self, provider: str = "cpu", device_name: str | None = None) -> MeasuredFn:
        """A function giving the measured forward seconds of ``(op, factors)``, ``None`` if absent.

        The timings of this provider and device are read once, now; the returned function rebuilds
        the shard's signature (:func:`objectives.onnx_build.shard_spec`) and looks it up.

        Parameters
        ----------
        provider:
            ``"cpu"`` or ``"cuda"``.
        device_name:
            The device the timings were taken on; default: this machine's
            (:func:`detect_device_name`).
        """
        device = device_name or detect_device_name(provider)
        table = self.timings(provider=provider, device_name=device)

        def measured(op: Op, factors: Mapping[str, int]) -> float | None:
            if not table or op.node is None:
                return None
            spec = shard_spec(op, factors)
            return None if spec is None else table.get(spec.key)

        return measured


# --------------------------------------------------------------------------------------------------
# The whole graph.


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
        ``"cpu"`` or ``"cuda"``.
    repeats, warmup, time_budget_s:
        See :func:`measure_shards`.
    progress:
        Called with (shards measured, shards to measure) as measuring proceeds.
    max_shards:
        Measure at most this many new shards (the rest are ``pending``; run again to go on).
    device_name:
        Key of this hardware in the database; default :func:`detect_device_name`.
    max_shard_bytes:
        Skip shards whose inputs and outputs exceed this many bytes (default: a quarter of this
        machine's memory).

    Returns
    -------
    ProfileReport
        Counts: measured now, already in the database, failed, pending, unprofilable configurations.

    Raises
    ------
    InputError
        Unknown or unavailable provider, a config space per op missing, bad repeats/warmup.
    """
    started = time.perf_counter()
    _check_provider(provider)
    if len(config_spaces) != len(graph.ops):
        raise InputError(
            f"got {len(config_spaces)} config spaces for {len(graph.ops)} ops; pass one per op of the graph"
        )
    if repeats < 1 or warmup < 0:
        raise InputError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup}); fix the values")
    device = device_name or detect_device_name(provider)
    limit = max_shard_bytes if max_shard_bytes is not None else _physical_memory_bytes() // 4

    specs: dict[str, ShardSpec] = {}
    config_keys: list[str] = []
    configs = 0
    unprofilable = 0
    by_type: Counter[str] = Counter()
    examples: list[str] = []
    for op, space in zip(graph.ops, config_spaces):
        for row in np.unique(space.factors, axis=0):  # rows differing only in node placement: once
            configs += 1
            factors = dict(zip(space.dim_names, (int(f) for f in row)))
            result = shard_spec_or_reason(op, factors)
            if isinstance(result, str):
                unprofilable += 1
                by_type[op.op_type] += 1
                if len(examples) < 5:
                    examples.append(f"{op.name}: {result}")
                continue
            specs.setdefault(result.key, result)
            config_keys.append(result.key)

    timed = db.timings(provider=provider, device_name=device)
    known_failures = db.failures(provider=provider, device_name=device)
    cached = sum(1 for key in specs if key in timed)
    todo = [s for key, s in specs.items() if key not in timed and key not in known_failures]
    failed_keys = {key for key in specs if key in known_failures}
    too_big = [s for s in todo if _shard_bytes(s) > limit]
    for spec in too_big:  # not recorded: another machine or limit may run it
        failed_keys.add(spec.key)
        if len(examples) < 5:
            examples.append(f"{spec.op_name}: shard needs {_shard_bytes(spec)} bytes, over {limit}")
    todo = [s for s in todo if _shard_bytes(s) <= limit]
    pending = 0
    if max_shards is not None and len(todo) > max_shards:
        pending = len(todo) - max_shards
        todo = todo[: max(max_shards, 0)]

    measured_now = 0
    families: dict[str, list[ShardSpec]] = {}
    for spec in todo:
        families.setdefault(spec.model_key, []).append(spec)
    done = 0
    for members in families.values():
        for start in range(0, len(members), _FAMILY_CHUNK):
            chunk = members[start : start + _FAMILY_CHUNK]
            results = measure_shards(chunk, provider=provider, repeats=repeats, warmup=warmup,
                                     time_budget_s=time_budget_s)
            now = time.time()
            rows = []
            failures = []
            for spec, result in zip(chunk, results):
                if isinstance(result, str):
                    failures.append((spec.key, result, spec.description))
                    failed_keys.add(spec.key)
                    if len(examples) < 5:
                        examples.append(f"{spec.op_name}: {result}")
                    continue
                rows.append(
                    ProfileRow(
                        signature=spec.key,
                        provider=provider,
                        device_name=device,
                        median_s=result.median_s,
                        repeats=result.repeats,
                        spread_s=result.spread_s,
                        measured_dtypes=result.measured_dtypes,
                        method=result.method,
                        description=spec.description,
                        created_unix=now,
                    )
                )
            db.record(rows)  # one short transaction per batch: a killed run keeps what it measured
            db.record_failures(failures, provider=provider, device_name=device)
            measured_now += len(rows)
            done += len(chunk)
            if progress is not None:
                progress(done, len(todo))

    for op_key in config_keys:
        if op_key in failed_keys:
            unprofilable += 1
    failed_types = Counter(specs[k].op_type for k in config_keys if k in failed_keys)
    by_type.update(failed_types)
    return ProfileReport(
        provider=provider,
        device_name=device,
        configs=configs,
        shards=len(specs),
        measured=measured_now,
        cached=cached,
        failed=len(failed_keys),
        pending=pending,
        unprofilable_configs=unprofilable,
        unprofilable_by_type=dict(by_type),
        examples=tuple(examples),
        elapsed_s=time.perf_counter() - started,
    )

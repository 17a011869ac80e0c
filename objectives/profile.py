r"""Measured time of each op's per-device shard (onnxruntime or PyTorch), cached in SQLite.

FlexFlow prices strategies with measured per-operator times; this module measures them on the
hardware at hand (``planner profile``) so the cost model can use them instead of the roofline.

The parts, one module each (their names are re-exported here):

* providers, what runs the shards: :mod:`objectives.profile_providers` (:data:`PROVIDERS`, a registry
  of :class:`Backend`: onnxruntime ``cpu`` / ``cuda``, PyTorch ``torch-cpu`` / ``torch-cuda``);
* how onnxruntime times a shard: :mod:`objectives.ort_timing` (PyTorch: :mod:`objectives.torch_profile`);
* the database: :mod:`objectives.profile_db` (:class:`ProfileDB`, one SQLite file several processes
  profile into at once);
* reading timings for a plan: :mod:`objectives.profile_lookup` (:func:`open_measured`).

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
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from objectives import torch_profile
from objectives.ort_timing import ORT_PROVIDERS, Measurement
from objectives.profile_db import APPLICATION_ID, SCHEMA_VERSION, MeasuredFn, ProfileDB, ProfileRow
from objectives.profile_lookup import MeasuredLookup, MeasuredSource, open_measured
from objectives.profile_providers import (
    PROVIDERS,
    Backend,
    _backend,
    _Shard,
    _Timing,
    detect_device_name,
    measure_shards,
)
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph, Tensor

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

_CLAIM_BATCH = 4
"""Shards claimed at once: small, so two processes share a model's shards evenly."""


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
    """Measure every distinct per-device shard of every op over the given configurations: a
    :class:`ProfileReport` of the counts (measured now, measured by another process meanwhile,
    already in the database, failed, pending, unprofilable configurations) and the signatures measured now.

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


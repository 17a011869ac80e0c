r"""The profiling providers: what runs the shards, as a registry (:data:`PROVIDERS` of :class:`Backend`).

* ``cpu`` / ``cuda``: onnxruntime runs the op's main ONNX node rebuilt at the shard shape
  (:mod:`objectives.onnx_build`, timed by :mod:`objectives.ort_timing`); forward only (the cost model
  takes backward as ``backward_flops_factor`` times it). Keyed by the node's shard signature
  (:attr:`~objectives.onnx_build.ShardSpec.key`).
* ``torch-cpu`` / ``torch-cuda``: PyTorch runs the call that stands for the shard
  (:mod:`objectives.torch_profile`: GEMM, norm, softmax, elementwise, embedding, slice, concat),
  forward **and backward** (autograd w.r.t. every float input), in ``bfloat16`` on CUDA (the
  ``bf16-mixed`` default) and ``float32`` on CPU unless told. Keyed by
  :func:`objectives.torch_profile.call_signature` (the call and its dtype), so the cost model needs
  the graph's tensors to find a row (:meth:`~objectives.profile_db.ProfileDB.lookup_fn`).

Each backend maps a configuration to its shard, gives the shard's memory (shards over the limit are
skipped) and times a batch of shards; :func:`detect_device_name` names the hardware a provider runs
on, part of every database key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from objectives import torch_profile
from objectives.host import cpu_device_name
from objectives.onnx_build import FLOAT32_FALLBACK, ShardSpec, shard_spec_or_reason
from objectives.ort_timing import ORT_PROVIDERS, Measurement, _measure_family
from planner.core.errors import InputError
from planner.core.graph import Op, Tensor

__all__ = ["PROVIDERS", "Backend", "detect_device_name", "measure_shards"]

_FAMILY_CHUNK = 16
"""Shards per onnxruntime session at most, so one profiler trace stays small."""


# --------------------------------------------------------------------------------------------------
# Device names and providers.


def detect_device_name(provider: str = "cpu") -> str:
    """A stable name of the hardware a provider runs on, part of every database key.

    CPU (``cpu``, ``torch-cpu``): the ``model name`` from ``/proc/cpuinfo`` (else
    :func:`platform.processor`) and the core count (:func:`objectives.host.cpu_device_name`); ``cuda``: the first GPU's name from ``nvidia-smi``
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
    return cpu_device_name()


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

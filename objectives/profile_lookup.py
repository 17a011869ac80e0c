r"""Reading timings for a plan: which device's rows a plan uses, and the lookup the cost model calls.

:func:`open_measured` opens a profile database (:mod:`objectives.profile_db`), picks the group of
timings (provider and device, :class:`MeasuredSource`) that matches the planned device
(:func:`same_device`), and returns a :class:`MeasuredLookup`: the ``(op, factors) -> seconds |
(forward, backward) | None`` function (:data:`MeasuredFn`) the cost model reads, and notes that say
where the times come from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from objectives import torch_profile
from objectives.profile_db import MeasuredFn, ProfileDB
from objectives.profile_providers import PROVIDERS
from planner.core.errors import InputError
from planner.core.graph import Op, OpGraph

__all__ = ["MeasuredSource", "MeasuredLookup", "open_measured", "same_device"]


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

"""The data-parallel baseline as a launchable plan: pure data parallelism on every device, priced
once per launcher under its execution model and memory rules, so it can join the launchable frontier.

``planner plan`` prints this baseline beside its table (``vs DP``). A search stopped by
``--time-limit`` may not reach the plain ``pp = 1``, ``dp = devices`` combination, and then the pick
could be slower than the baseline line printed under it (Qwen3-8B widths on 1,024 H100s at 30 s:
pick 84.55 ms beside a fitting 80.96 ms baseline). :func:`data_parallel_points` prices that plan for
each launcher that runs it exactly as priced, so :mod:`planner.launchable` lists it as a row, and
seeds the searches with it (a combination it dominates is skipped, the frontier unchanged); at each
ZeRO stage searched, since where ZeRO-0's states do not fit, pure data parallelism with sharded states
is often the fastest plan that does (StarCoder2-7B on 1,024 H100s: a search stopped at 60 s picked
1.027 s beside pure data parallelism at ZeRO-2, 0.835 s, which a longer search finds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from planner.core.degrees import Pins
from planner.pipeline import PipelineCostCache, PipelineOptions, PipelinePoint, point_plan_input


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselinePoint:
    """Pure data parallelism priced under one launcher's execution model and memory rules."""

    point: PipelinePoint
    cache: PipelineCostCache
    runners: tuple[str, ...]
    """The launchers searched that run it exactly as priced (registry order), the pricing one included."""


def baseline_searched(options: PipelineOptions, pins: Pins, devices: int, zero: int = 0) -> bool:
    """Whether the search space holds the baseline at ZeRO stage ``zero`` (``pp = 1``, ``dp = devices``,
    one micro-batch of ``global_batch / devices`` samples per rank, no recomputation, no offload or
    hybrid sharding): a row outside what the user asked for (``--fix``, ``--micro-batch``...) is not listed."""
    if options.global_batch % devices:
        return False
    per_rank = options.global_batch // devices
    pinned = (pins.dp in (None, devices) and pins.tp in (None, 1) and pins.pp in (None, 1) and pins.cp in (None, 1)
              and pins.ep in (None, 1) and pins.zero in (None, zero) and pins.recompute in (None, "none")
              and pins.mb in (None, per_rank) and pins.offload in (None, "none") and pins.hsdp is None
              and pins.tp_overlap != "on")  # fmt: skip
    return (pinned and zero in options.zero_stages and "none" in options.recompute
            and options.micro_batch in (None, per_rank) and 1 in (options.pipeline_sizes or (1,)))


def launcher_pricing_rules(rules: Any) -> tuple:
    """``(sequence_shard_saved, fused_swiglu, grad_accumulator, zero_sync)`` of a launcher's search rules
    (:class:`~planner.search.pipeline.TargetRules`; ``None``: a launcher without rules): what
    :func:`data_parallel_point` takes as ``memory_rules`` to price pure data parallelism as that launcher runs it."""
    return (getattr(rules, "sequence_shard_saved", False), getattr(rules, "fused_swiglu", False),
            getattr(rules, "grad_accumulator", None), getattr(rules, "zero_sync", None))


def data_parallel_point(cache: PipelineCostCache, *, global_batch: int, memory_limit_bytes: float | None,
                        memory_rules: tuple = (None, None, None, None), zero: int = 0) -> PipelinePoint | None:
    """Pure data parallelism on every device of ``cache``'s cluster at ZeRO stage ``zero``, priced by
    :func:`planner.estimate.estimate` (``memory_rules``: a launcher's ``(sequence_shard_saved, fused_swiglu,
    grad_accumulator, zero_sync)``: its memory rules and ZeRO-1/2 time rule; ``None``s: estimate's own); ``None`` when the global batch does not split over the
    devices or the plan cannot run."""
    from planner.estimate import estimate

    devices = cache.cluster.devices
    if global_batch % devices:
        return None
    estimated = estimate(cache, cluster=cache.cluster, tp=1, pp=1, dp=devices, micro_batch=global_batch // devices,
                         global_batch=global_batch, zero=zero, settings=cache.settings, memory_limit_bytes=memory_limit_bytes,
                         sequence_shard_saved=memory_rules[0], fused_swiglu=memory_rules[1], grad_accumulator=memory_rules[2],
                         zero_sync=memory_rules[3] if len(memory_rules) > 3 else None)
    return estimated.point if estimated.valid else None


def data_parallel_points(usable: Sequence[str], rules_of: Callable[[str], Any], cache_of: Callable[[str], PipelineCostCache],
                         executions: Mapping[str, Any], *, global_batch: int,
                         memory_limit_bytes: float | None, zero: int = 0) -> list[BaselinePoint]:
    """The baseline at ZeRO stage ``zero`` priced once per distinct (execution model, memory rules) of the
    ``usable`` launchers (``rules_of(name)``: its :class:`~planner.search.pipeline.TargetRules` or ``None``;
    ``cache_of(name)``: the cache its search prices with), each with the launchers of that execution
    model whose exporter rules run it (:func:`exporters.targets.runnable_plan_targets`); none where
    a launcher refuses pure data parallelism or the global batch does not split over the devices."""
    from exporters.targets import runnable_plan_targets

    found: list[BaselinePoint] = []
    priced: set[tuple] = set()
    for name in usable:
        rules, cache = rules_of(name), cache_of(name)
        memory_rules = launcher_pricing_rules(rules)
        key = (id(cache), memory_rules)
        if key in priced:
            continue
        priced.add(key)
        held = cache.holds(cache.cluster.devices, global_batch)
        point = data_parallel_point(cache, global_batch=global_batch, memory_limit_bytes=memory_limit_bytes,
                                    memory_rules=memory_rules, zero=zero)
        if not held and not getattr(cache, "keep", False):
            # the searches release what they build; models built here would stay through all of them
            # (Qwen3-32B on 1,024 H100s: 0.52 -> 1.02 GB peak)
            cache.release(cache.cluster.devices, global_batch)
        if point is None:
            continue
        (runs,) = runnable_plan_targets([point_plan_input(point, cache)])
        runners = tuple(n for n in runs if n in usable and executions[n] == executions[name])
        if name in runners:
            found.append(BaselinePoint(point=point, cache=cache, runners=runners))
    return found

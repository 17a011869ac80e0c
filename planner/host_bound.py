r"""Whether a plan's step is set by the host, not by its devices (issue 23: fixed costs show).

Under a launcher's execution model each pipeline stage's pass takes at least its host work,
:math:`F_s = \max(W^f_s, H^f_s)` forward and :math:`B_s = \max(W^b_s, H^b_s)` backward per micro-batch,
with :math:`W` the kernels' work on the device and :math:`H` the host floor
(:func:`objectives.fixed_costs.host_floor_s`: forward :math:`L h_{layer} + h_{mb}`, backward
:math:`(2 + r) L h_{layer}`, :math:`L` the stage's layers; ``docs/COST_MODEL.md``, "Fixed costs").

* A stage's pass is **host-bound** when :math:`H \ge W`: its priced time is the floor
  (:func:`stage_floors` gives :math:`H`; the priced :math:`F_s`, :math:`B_s` are the point's
  ``StagePlan.forward_s`` / ``backward_s``, so :math:`H \ge W \iff F_s \le H^f_s`).
* A **plan** is host-bound when every stage of the largest :math:`F_s + B_s` (the pipeline's
  bottleneck, which sets the step) is host-bound in both passes: less device work (more devices, a
  finer split, faster kernels) does not shorten its step.

The plain roofline has no floor (:func:`stage_floors` is ``None``), nor has a per-op plan of the
research search (no stages): neither is ever host-bound.

This is the roof: the launchable table flags its rows (``planner.launchable``) and ``planner explain``
names the stages and their margins (``planner.repriced``, ``planner.render``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["stage_floors", "pass_bound", "host_bound", "host_note"]


def stage_floors(point: Any, cache: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(forward, backward)`` host floors per stage of ``point`` (seconds per micro-batch), as its price
    applied them (:func:`objectives.pipeline_price.stage_host_floors_s` at its stages' layers and
    recomputation); ``None`` where no floor applies (the roofline, or a point without stages)."""
    from objectives.pipeline_price import stage_host_floors_s

    stages = getattr(point, "stages", ())
    if not stages or cache is None:
        return None
    layers = np.array([stage.layers[1] - stage.layers[0] for stage in stages], dtype=np.float64)
    floors = stage_host_floors_s(cache, layers, point.recompute)
    return None if floors is None else (np.asarray(floors[0], np.float64), np.asarray(floors[1], np.float64))


def pass_bound(priced_s: float, floor_s: float) -> bool:
    """Whether a pass priced ``max(work, floor)`` = ``priced_s`` is the host's: a floor at least its work.

    >>> pass_bound(11.8e-3, 11.8e-3), pass_bound(12.5e-3, 11.8e-3), pass_bound(0.0, 0.0)
    (True, False, False)
    """
    return floor_s > 0.0 and priced_s <= floor_s


def host_bound(point: Any, cache: Any) -> bool:
    """Whether ``point``'s step is set by the host (module docstring): every stage of the largest
    forward + backward per micro-batch has both passes on its floor.

    >>> from types import SimpleNamespace as S
    >>> from objectives.cluster import get_device, make_cluster
    >>> from planner.core.settings import TrainingSettings
    >>> cache = S(cluster=make_cluster("a100-80gb", devices=8), settings=TrainingSettings(engine="fused", attention="flash"))
    >>> floored = S(layers=(0, 12), forward_s=12 * 0.9e-3 + 1e-3, backward_s=2 * 12 * 0.9e-3)  # 11.8 and 21.6 ms
    >>> host_bound(S(stages=(floored,), recompute="none"), cache)
    True
    >>> longer = S(layers=(0, 12), forward_s=11.8e-3, backward_s=25e-3)  # the backward's kernels outlast its floor
    >>> host_bound(S(stages=(longer,), recompute="none"), cache), host_bound(S(stages=(floored,), recompute="none"), None)
    (False, False)
    """
    floors = stage_floors(point, cache)
    if floors is None:
        return False
    passes = np.array([stage.forward_s + stage.backward_s for stage in point.stages])
    slowest = np.flatnonzero(passes >= passes.max() * (1 - 1e-12))
    return all(pass_bound(point.stages[s].forward_s, floors[0][s]) and pass_bound(point.stages[s].backward_s, floors[1][s])
               for s in slowest)  # fmt: skip


def host_note(device: Any) -> str:
    """The table's footnote on its ``h`` marker, with the device's host constants.

    >>> from objectives.cluster import get_device
    >>> print(host_note(get_device("a100-80gb")))  # doctest: +NORMALIZE_WHITESPACE
    h: the step is bound by the host, not the GPUs: they wait for it to issue their kernels (a100-80gb: 0.90 ms
    per layer forward, twice that backward, 1.00 ms per micro-batch, 30 us per kernel), so more devices or a finer
    split do not speed it up; planner explain shows each stage's margin
    """
    return (f"h: the step is bound by the host, not the GPUs: they wait for it to issue their kernels ({device.name}: "
            f"{device.layer_host_s * 1e3:.2f} ms per layer forward, twice that backward, {device.microbatch_host_s * 1e3:.2f} ms "
            f"per micro-batch, {device.host_dispatch_s * 1e6:.0f} us per kernel), so more devices or a finer split do not "
            "speed it up; planner explain shows each stage's margin")  # fmt: skip

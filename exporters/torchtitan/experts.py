r"""Which expert-parallel rows torchtitan 0.3.0 runs as the planner priced them, and why not the others.

The planner's ``ep`` (``TrainingSettings.expert_parallel``, :mod:`objectives.moe`) splits each MoE
layer's experts ``ep`` ways over the data-parallel ranks of its expert ops (their token split ``R_t``,
which holds the ``cp`` ranks too): the experts keep their tensor-parallel split (Megatron's
``--expert-tensor-parallel-size`` = tp), the routed tokens move by four all-to-alls over the ``ep``
ranks, innermost after the ops' other splits; under ZeRO-3 the expert states stay sharded over all
``R_t`` ranks (``ep`` local experts times ``R_t / ep`` shards), and their reduce-scatter and
all-gathers run over ``R_t / ep`` ranks on ``1 / ep`` of the bytes.

torchtitan 0.3.0 (read in ``.venv-integration``) builds expert parallelism from
``parallelism.expert_parallel_degree`` alone; it has no expert tensor-parallel degree:

* ``ParallelDims.build_mesh`` (``torchtitan/distributed/parallel_dims.py`` l. 277-279, 336-340):
  ``fsdp = dp_shard * cp``, ``efsdp = fsdp * tp // ep`` and the sparse mesh
  ``("pp", "dp_replicate", "efsdp", "ep")`` unflattened from the world, ``ep`` innermost: the ``ep``
  ranks are consecutive ranks of the dense mesh ``(pp, dp_replicate, dp_shard, cp, tp)``, so they take
  the ``tp`` ranks first, then ``cp``'s, then ``dp_shard``'s; ``dp_replicate`` stays outside
  (``ParallelismConfig.expert_parallel_degree``'s docstring, ``config/configs.py`` l. 279-286:
  "EP borrows ranks from FSDP and TP"). ``ParallelDims._validate`` (l. 170-189) checks only the dense
  product; the unflatten needs ``ep`` to divide ``dp_shard * cp * tp``.
* ``models/common/moe_sharding.py`` l. 29-47 and 194-219: with ``ep > 1`` the routed experts' weights
  are ``Shard(0)`` (whole experts) on ``ep`` and replicated on ``efsdp``, never split on ``tp``; the
  MoE's tokens are sequence-split over the ``tp`` ranks (l. 201-210).
* ``distributed/fsdp.py`` l. 224-233 (``apply_fsdp_to_decoder``) and ``models/qwen3/parallelize.py``
  l. 87-92: the routed experts are ``fully_shard``-ed over ``efsdp`` (with ``dp_replicate`` under
  HSDP), on dim 0 of the local ``[E / ep, F, D]`` weights, or dim 1 when ``efsdp * ep`` exceeds the
  expert count; FSDP2 pads a dim that the shard count does not divide.
* ``models/common/config_utils.py`` l. 416-420: ``moe_comm_backend="standard"`` is the
  ``AllToAllTokenDispatcher``: all-to-all dispatch and combine, dropless.

So the planner's row is torchtitan's with ``expert_parallel_degree = ep`` exactly when:
``tp = 1`` (at ``tp > 1`` the ``ep`` ranks are the ``tp`` ranks, holding whole experts on split
tokens), ZeRO-3 (at ZeRO-0 the data-parallel ranks are ``dp_replicate``, outside the ``ep`` region),
no HSDP (the experts' ``dp_replicate`` all-reduce carries ``1 / (dp_shard cp)`` of their gradients
whatever ``ep`` is, where the planner scales every expert sync term by ``ep``), ``ep`` dividing
``dp x cp`` (so ``efsdp = dp cp / ep``), and the experts' FSDP shards even (no padding, which the
planner does not price). Then the sparse mesh's ``ep`` groups are ``ep`` consecutive ranks, the
innermost of the data-parallel ones as priced; each rank holds ``E / ep`` experts sharded
``dp cp / ep`` ways, ``1 / (dp cp)`` of the expert states, as ZeRO-3 priced.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importers.transformer import MoeSummary, TransformerModel
    from planner.core.settings import TrainingSettings

__all__ = ["expert_parallel_refusal", "expert_fsdp_degree"]


def expert_fsdp_degree(*, dp_shard: int, cp: int, tp: int, ep: int) -> int:
    """``efsdp``: the ranks torchtitan's FSDP2 shards each local expert weight over
    (``parallel_dims.py`` l. 279: ``efsdp = dp_shard * cp * tp // ep``).

    >>> expert_fsdp_degree(dp_shard=8, cp=2, tp=1, ep=4)
    4
    """
    return dp_shard * cp * tp // ep


def _uneven_shard(moe: MoeSummary, model: TransformerModel, *, efsdp: int, ep: int, expert_ffn: int) -> str | None:
    """The padding FSDP2 would add to the local experts (``fsdp.py`` l. 224-233: dim 0 of ``[E / ep, F, D]``,
    dim 1, ``F`` for ``w1`` / ``w3`` and ``D`` for ``w2``, where ``efsdp x ep`` exceeds the experts), or ``None``."""
    local = moe.num_experts // ep
    if efsdp * ep <= moe.num_experts:
        if local % efsdp:
            return f"its {local} local experts (of {moe.num_experts}, ep={ep}) do not split evenly over efsdp={efsdp}"
        return None
    for what, size in (("expert FFN size", expert_ffn), ("hidden size", model.hidden_size)):
        if size % efsdp:
            return f"the {what} ({size}) does not split evenly over efsdp={efsdp} (its experts shard on dim 1)"
    return None


def expert_parallel_refusal(settings: TrainingSettings, moe: MoeSummary | None, model: TransformerModel | None, *,
                            dp: int, cp: int, tp: int, expert_ffn: int | None = None) -> str | None:
    """Why torchtitan 0.3.0 does not run the planner's ``ep`` row at ``dp x cp x tp`` as priced
    (module docstring), one line, or ``None`` where it does (``ep = 1`` always). ``expert_ffn``: each routed
    expert's FFN size (elements; ``None``: ``model.ffn_hidden_size``, every layer routed; DeepSeek-V3's
    dense layers have another, :func:`exporters.torchtitan.moe.routed_ffn`)."""
    ep = settings.expert_parallel
    if ep <= 1:
        return None
    if moe is None or model is None:
        return f"the model routes no token to experts: expert parallelism ep={ep} has nothing to split; plan with ep 1"
    if tp > 1:
        return (f"torchtitan's expert parallelism takes the tp={tp} ranks first (ParallelDims: efsdp = dp_shard x cp x "
                "tp / ep) and holds whole experts on them, not the planner's tp-split experts with ep over the "
                "data-parallel ranks; plan with --fix tp=1 or ep 1")
    if settings.zero_stage != 3:
        return (f"torchtitan's expert parallelism borrows its ranks from dp_shard x cp, and ZeRO-{settings.zero_stage} "
                "runs dp as data_parallel_replicate_degree, outside them; plan with --zero 3")
    shard = dp if settings.dp_shard is None else math.gcd(dp, settings.dp_shard)  # export.data_parallel_split
    if shard < dp:
        return (f"under HSDP torchtitan all-reduces the experts' gradients over dp_replicate={dp // shard} "
                "at the dense size whatever ep is, where the planner scales that sync by ep; plan without --fix hsdp")
    if (dp * cp) % ep:
        return f"ep={ep} does not divide dp x cp = {dp * cp}, the ranks torchtitan's expert parallelism borrows"
    uneven = _uneven_shard(moe, model, efsdp=expert_fsdp_degree(dp_shard=dp, cp=cp, tp=1, ep=ep), ep=ep,
                           expert_ffn=model.ffn_hidden_size if expert_ffn is None else expert_ffn)
    if uneven:
        return f"FSDP2 would pad the experts' shards, which the planner does not price: {uneven}"
    return None

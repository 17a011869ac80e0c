"""The parallel degrees of a plan, and the knobs a user pins (``--fix pp=8,tp=4,zero=1``).

One value type for the degrees, as torchtitan's ``ParallelDims`` and Megatron-Core's
``ModelParallelConfig`` keep one: every floor that names a plan's layout (the search's rows, the
table, the plan files, the exporters) reads the same :class:`Degrees`. Each degree is named for
what it splits, so a split of the sequence is never called tensor parallelism.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Literal, Sequence

from planner.core.configs import ConfigSpace
from planner.core.dims import shown
from planner.core.errors import InputError
from planner.core.graph import Op, OpGraph
from planner.core.settings import OFFLOAD_MIN_ZERO, OFFLOAD_MODES, RESHARD_POLICIES

__all__ = ["Degrees", "Pins", "parse_fix", "PIN_KEYS", "op_degrees", "dim_roles", "dominant_degrees"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Degrees:
    """How many ways a plan splits each kind of work (1: not split).

    ``dp * cp * tp * pp`` devices run the plan; expert parallelism splits the experts over the
    data-parallel ranks (``ep`` divides ``dp * cp``), as Megatron-Core's ``expert-model-parallel-size``
    does, so it uses no devices of its own.
    """

    dp: int = 1
    """Data parallelism: replicas, each on a slice of the samples (the batch dim split)."""
    tp: int = 1
    """Tensor parallelism: a layer's weights split (heads, hidden, vocabulary)."""
    pp: int = 1
    """Pipeline parallelism: stages of consecutive layers."""
    cp: int = 1
    """Context parallelism: the sequence split across ranks (attention exchanges keys and values)."""
    ep: int = 1
    """Expert parallelism (Mixture-of-Experts): the experts split over the data-parallel ranks."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"the degree {item.name} must be a positive integer (got {value!r})")

    @property
    def devices(self) -> int:
        """Devices the plan runs on (``dp * cp * tp * pp``)."""
        return self.dp * self.cp * self.tp * self.pp

    def label(self) -> str:
        """The degrees above 1, outermost first (``"pp=2 x dp=4 x tp=2"``; ``"1 device"`` for none).

        Examples
        --------
        >>> Degrees(dp=4, tp=2, pp=2).label()
        'pp=2 x dp=4 x tp=2'
        >>> Degrees(dp=8, ep=4).label()
        'dp=8 x ep=4'
        >>> Degrees().label()
        '1 device'
        """
        parts = [f"{name}={value}" for name, value in
                 (("pp", self.pp), ("dp", self.dp), ("cp", self.cp), ("tp", self.tp), ("ep", self.ep)) if value > 1]
        return " x ".join(parts) or "1 device"


PIN_KEYS: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep", "zero", "recompute", "mb", "offload", "hsdp", "tp_overlap",
                             "reshard", "cuda_graphs", "p2p_overlap")
"""What ``--fix`` may pin: a degree, the ZeRO stage, the recomputation, the micro-batch (``mb``,
samples per data-parallel rank), CPU offload (``offload``: ``objectives.offload``, searched only
when pinned or when no plan fits without it), the HSDP shard group (``hsdp``: ranks, with ZeRO 1-3) or FSDP2's
``reshard_after_forward`` policy (``reshard``: default, always or never, ZeRO-3), or the CUDA-graph replay of each
micro-batch (``cuda_graphs``: on or off; unpinned, as each launcher runs it: torchtitan's at ``pp = 1``), or the
interleaved schedule's transfers overlapped with the chunks' passes (``p2p_overlap``: on or off; unpinned, as each
launcher runs it: Megatron-LM's on)."""

_ELSEWHERE = {
    "precision": "give it with --dtype, e.g. --dtype fp8 (or --dtype bf16,fp8 to search both)",
    "dtype": "give it with --dtype, e.g. --dtype fp8 (or --dtype bf16,fp8 to search both)",
    "fp8": "give it with --dtype, e.g. --dtype fp8 (or --dtype bf16,fp8 to search both)",
    "schedule": "give it with --schedule, e.g. --schedule interleaved",
    "global_batch": "give it with --global-batch, e.g. --global-batch 512",
}
"""Settings users try to ``--fix`` that another flag sets: the flag to use instead."""

_RECOMPUTE = ("none", "selective", "mlp", "full", "op")
_TP_OVERLAP = ("on", "off")
_NAMED = ("recompute", "offload", "tp_overlap", "reshard", "cuda_graphs", "p2p_overlap")
"""The keys whose value is a name, not a number."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """Degrees and knobs the user fixed; ``None``: searched."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    zero: int | None = None
    """ZeRO stage 0-3 (1: Megatron's distributed optimizer)."""
    recompute: Literal["none", "selective", "mlp", "full", "op"] | None = None
    mb: int | None = None
    """Samples per data-parallel rank per micro-batch (Megatron's ``--micro-batch-size``)."""
    offload: Literal["none", "optimizer", "activations", "parameters"] | None = None
    """CPU offload (``TrainingSettings.offload``); ``None``: off, unless no plan fits without it."""
    tp_overlap: Literal["on", "off"] | None = None
    """Tensor-parallel communication overlapped with the GEMMs (``TrainingSettings.tp_comm_overlap``,
    Megatron-LM's ``--tp-comm-overlap``); ``None``: off, Megatron-LM's default."""
    hsdp: int | None = None
    """Hybrid sharding (``TrainingSettings.dp_shard``): the ranks one copy of the ZeRO-sharded states
    spans; ``None``: searched (a node's devices, where the data-parallel group spans nodes)."""
    reshard: Literal["default", "always", "never"] | None = None
    """FSDP2's ``reshard_after_forward`` policy at ZeRO-3 (``TrainingSettings.reshard_after_forward``);
    ``None``: torchtitan's ``default``."""
    cuda_graphs: Literal["on", "off"] | None = None
    """Each micro-batch's forward and backward replayed as one CUDA graph (``TrainingSettings.cuda_graphs``); ``None``:
    as each launcher runs it (torchtitan captures at ``pp = 1`` without expert parallelism, the others never)."""
    p2p_overlap: Literal["on", "off"] | None = None
    """The interleaved schedule's steady-state transfers overlapped with the other direction's chunk pass
    (``TrainingSettings.p2p_overlap``: Megatron-LM's ``overlap_p2p_comm``, ``off`` exported as
    ``--no-overlap-p2p-communication``); ``None``: as each launcher runs it (Megatron-LM overlaps, the others wait)."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "mb", "hsdp"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise InputError(f"--fix {name} must be a positive integer (got {value!r}), e.g. --fix {name}=2")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise InputError(f"--fix zero must be 0, 1, 2 or 3 (got {self.zero!r}), e.g. --fix zero=1")
        if self.recompute is not None and self.recompute not in _RECOMPUTE:
            raise InputError(f"--fix recompute must be none, selective, mlp, full or op (got {self.recompute!r})")
        if self.tp_overlap is not None and self.tp_overlap not in _TP_OVERLAP:
            raise InputError(f"--fix tp_overlap must be on or off (got {self.tp_overlap!r}), e.g. --fix tp_overlap=on")
        if self.tp_overlap == "on" and self.tp == 1:  # the overlap hides tensor-parallel collectives; tp=1 has none
            raise InputError("--fix tp_overlap=on overlaps tensor-parallel communication with the GEMMs, which tp=1 "
                             "does not have: drop tp=1 (the overlap runs only with tp > 1 and sequence parallelism)")
        if self.cuda_graphs is not None and self.cuda_graphs not in _TP_OVERLAP:
            raise InputError(f"--fix cuda_graphs must be on or off (got {self.cuda_graphs!r}), e.g. --fix cuda_graphs=off")
        if self.p2p_overlap is not None and self.p2p_overlap not in _TP_OVERLAP:
            raise InputError(f"--fix p2p_overlap must be on or off (got {self.p2p_overlap!r}), e.g. --fix p2p_overlap=off")
        if self.hsdp is not None and self.zero == 0:
            raise InputError("--fix hsdp shards the ZeRO states over a group of the data-parallel ranks; ZeRO-0 shards none (drop zero=0)")
        if self.reshard is not None and self.reshard not in RESHARD_POLICIES:
            raise InputError(f"--fix reshard must be default, always or never (got {self.reshard!r}), e.g. --fix reshard=never")
        if self.reshard not in (None, "default") and self.zero not in (None, 3):
            raise InputError(f"--fix reshard={self.reshard} is FSDP2's reshard_after_forward, which shards at ZeRO-3 only; "
                             f"drop zero={self.zero} or reshard")
        if self.offload is not None and self.offload not in OFFLOAD_MODES:
            raise InputError(f"--fix offload must be {', '.join(OFFLOAD_MODES[:-1])} or {OFFLOAD_MODES[-1]} "
                             f"(got {self.offload!r}), e.g. --fix offload=optimizer")
        if self.zero is not None and self.zero < OFFLOAD_MIN_ZERO.get(self.offload, 0):
            raise InputError(f"--fix offload={self.offload} keeps each rank's shard of the parameters on the host, which "
                             f"needs ZeRO-{OFFLOAD_MIN_ZERO[self.offload]} (FSDP); drop zero={self.zero} or use offload=optimizer")

    @property
    def pinned(self) -> dict[str, int | str]:
        """The pinned fields only, e.g. ``{"pp": 2, "zero": 1}``."""
        return {name: getattr(self, name) for name in PIN_KEYS if getattr(self, name) is not None}

    def admits(self, degrees: Degrees) -> bool:
        """Whether ``degrees`` keeps every pinned degree."""
        return all(getattr(self, name) in (None, getattr(degrees, name)) for name in ("dp", "tp", "pp", "cp", "ep"))


def parse_fix(text: str | None) -> Pins:
    """Read ``--fix pp=8,tp=4,zero=1`` (keys :data:`PIN_KEYS`, comma-separated).

    Raises
    ------
    InputError
        An unknown key, a repeated key, a value that is not a positive integer (``recompute``, ``offload``: a name).

    Examples
    --------
    >>> parse_fix("pp=2, tp=4,zero=1")
    Pins(dp=None, tp=4, pp=2, cp=None, ep=None, zero=1, recompute=None, mb=None, offload=None, tp_overlap=None, hsdp=None, reshard=None, cuda_graphs=None, p2p_overlap=None)
    >>> parse_fix("recompute=full").pinned
    {'recompute': 'full'}
    >>> parse_fix(None).pinned
    {}
    """
    values: dict[str, int | str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = (part.strip() for part in item.partition("="))
        name = name.lower()
        if sep and name in _ELSEWHERE:
            raise InputError(f"--fix does not pin {name}: {_ELSEWHERE[name]}")
        if not sep or name not in PIN_KEYS:
            raise InputError(
                f"cannot read --fix '{shown(item)}'; write KEY=VALUE with KEY one of {', '.join(PIN_KEYS)}, "
                "e.g. --fix pp=2,tp=4,zero=1"
            )
        if name in values:
            raise InputError(f"--fix names {name} twice; give each key once")
        if name in _NAMED:
            values[name] = value
            continue
        if not (value.isdigit() and len(value) <= 9):
            raise InputError(f"--fix {name}={shown(value)}: the value must be a positive integer, e.g. --fix {name}=2")
        values[name] = int(value)
    return Pins(**values)  # type: ignore[arg-type]


def op_degrees(graph: OpGraph, op: Op, space: ConfigSpace, row: int) -> tuple[int, int, int, int]:
    """``(dp, tp, cp, spatial)`` of one op's configuration, each named for what it splits: the batch
    dims (data parallelism); a convolution's or pooling's spatial dims; in an op with parameters,
    the dims a parameter is indexed by (tensor parallelism: heads, hidden, vocabulary) against the
    others (the tokens: context parallelism); in an op without (an attention core, a norm), a dim
    as long as a bound symbolic dim that is not the batch (``--dim seq=4096``: the sequence, cp)
    against the rest (heads, hidden: tp)."""
    degrees = {"dp": 1, "tp": 1, "cp": 1, "spatial": 1}
    for role, factor in zip(dim_roles(graph, op), space.factors[row].tolist()):
        degrees[role] *= factor
    return degrees["dp"], degrees["tp"], degrees["cp"], degrees["spatial"]


def dim_roles(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """Per dim of ``op``, the degree its split counts in (``"dp"``, ``"tp"``, ``"cp"`` or ``"spatial"``):
    :func:`op_degrees`' rule."""
    weight_dims = {name for access in op.inputs
                   if graph.tensors.get(access.tensor) is not None and graph.tensors[access.tensor].role == "parameter"
                   for axis in access.axes for name in axis}  # fmt: skip
    batch_sizes = {d.size for d in op.dims if d.is_batch}
    sequence_sizes = {size for size in graph.dim_bindings.values() if size not in batch_sizes and size > 1}
    roles = []
    for dim in op.dims:
        if dim.is_batch:
            roles.append("dp")
        elif dim.kind == "spatial":
            roles.append("spatial")
        elif dim.name in weight_dims or (not weight_dims and dim.size not in sequence_sizes):
            roles.append("tp")
        else:
            roles.append("cp")
    return tuple(roles)


def dominant_degrees(
    graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int]
) -> tuple[tuple[int, int, int, int], float, int] | None:
    """``((dp, tp, cp, hw), share, layouts)``: the degrees (:func:`op_degrees`) of the most FLOPs,
    their share of the FLOPs and how many distinct degrees the ops use; ``None``: no op has FLOPs."""
    weights: Counter[tuple[int, int, int, int]] = Counter()
    total = 0.0
    for op, space, row in zip(graph.ops, spaces, choice):
        if op.flops <= 0:
            continue
        weights[op_degrees(graph, op, space, row)] += op.flops
        total += op.flops
    if not weights:
        return None
    degrees, flops = weights.most_common(1)[0]
    return degrees, (flops / total if total else 1.0), len(weights)

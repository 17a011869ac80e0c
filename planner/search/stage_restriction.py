"""A stage's pipeline arrays restricted to the configurations a search allows: its own masks
(``pricing.masks``) or one launcher family's (:func:`restricted`, :class:`_Restricted`), and their edge tables
scaled to a step (:func:`_edges_per_step`): the intra-op problem of one stage that
:mod:`planner.search.pipeline` solves (``_choose_intra_op``). Moved out of that module unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.memo import IdentityMemo
from planner.core.tables import EdgeCost

__all__ = ["edge_cells", "restricted"]

StageArrays = Any
"""A stage's per-op costs (``planner.search.pipeline.StageArrays``)."""
PipelinePricing = Any
"""The pricing of a search (``planner.search.pipeline.PipelinePricing``)."""


def _labels(hashes: Sequence[tuple]) -> tuple[int, ...]:
    """Label each item by the first item with the same hash (which tables are equal)."""
    first: dict[tuple, int] = {}
    return tuple(first.setdefault(h, i) for i, h in enumerate(hashes))


def _digest(array: np.ndarray) -> tuple:
    return (array.shape, hash(np.ascontiguousarray(array).tobytes()))


@dataclass(frozen=True, slots=True, eq=False)
class _Restricted:
    """A stage cost model's arrays restricted to the allowed configurations (once per mask)."""

    index_maps: tuple[np.ndarray, ...]
    key: tuple[int, ...]
    time_s: Mapping[int, np.ndarray]
    """Per op key: forward + backward seconds per micro-batch, restricted."""
    step_s: Mapping[int, np.ndarray]
    states_bytes: Mapping[int, np.ndarray]
    activations_bytes: Mapping[int, np.ndarray]
    configs: tuple[ConfigSpace, ...]
    edges: tuple[EdgeCost, ...]
    """Per micro-batch, restricted."""
    edge_labels: tuple[int, ...]
    """Which restricted edge tables are equal (their equality does not change with the weights)."""
    blocks: tuple

    @staticmethod
    def build(arrays: StageArrays, masks: Sequence[np.ndarray], shared: "_Restricted | None" = None,
              cells: Any = None) -> "_Restricted":
        """Restrict ``arrays`` to ``masks``; ``shared``: a restriction of another model of the same
        (devices, batch) under the same masks, whose edges and spaces (equal) are taken as they are; ``cells``:
        the pair's edge tables priced at the cells asked (``objectives.edge_cells.EdgeCells``), where ``arrays``
        carry none, restricted there (the same tables)."""
        if shared is not None:
            keep = list(shared.index_maps)  # the same masks: the same rows
        else:
            rows_of: dict[int, np.ndarray] = {}  # ops share mask arrays
            keep = [rows_of[id(m)] if id(m) in rows_of else rows_of.setdefault(id(m), np.flatnonzero(m)) for m in masks]
        time_s: dict[int, np.ndarray] = {}
        step_s: dict[int, np.ndarray] = {}
        states: dict[int, np.ndarray] = {}
        acts: dict[int, np.ndarray] = {}
        key_of: list[int] = []
        seen: dict[tuple[int, int], int] = {}
        for i, base_key in enumerate(arrays.key):
            k = seen.setdefault((base_key, id(masks[i])), len(seen))
            key_of.append(k)
            if k not in time_s:
                rows = keep[i]
                time_s[k] = (arrays.forward_s[i] + arrays.backward_s[i])[rows]
                step_s[k] = arrays.step_s[i][rows]
                states[k] = (arrays.params_bytes[i] + arrays.grads_bytes[i] + arrays.optimizer_bytes[i])[rows]
                acts[k] = arrays.activations_bytes[i][rows]
        if shared is not None:
            edges, edge_labels, configs = shared.edges, shared.edge_labels, shared.configs
        else:
            if cells is not None:
                edges = cells.restricted(keep)  # priced at these rows only (the whole tables' cells, to the bit)
            else:
                memo: dict[tuple, np.ndarray] = {}
                edge_list = []
                for e in arrays.edges:
                    memo_key = (id(e.time_s), id(masks[e.u]), id(masks[e.v]))
                    if memo_key not in memo:
                        memo[memo_key] = e.time_s[np.ix_(keep[e.u], keep[e.v])]
                    edge_list.append(EdgeCost(u=e.u, v=e.v, time_s=memo[memo_key]))
                edges = tuple(edge_list)
            tables = {id(e.time_s): e.time_s for e in edges}  # each distinct table once
            digests = {at: _digest(table) for at, table in tables.items()}
            edge_labels = _labels([(e.u, e.v, digests[id(e.time_s)]) for e in edges])
            # ops of one space and mask share their restricted space (a new one per op was 116,438 subsets, ~1 of the
            # 175B plan's 135 profiled s; issue 22, nineteenth round): read by value only, by the DPs and heuristics
            subsets: dict[tuple[int, int], ConfigSpace] = {}
            configs = tuple(
                subsets[(id(c), id(k))] if (id(c), id(k)) in subsets else subsets.setdefault((id(c), id(k)), c.subset(k))
                for c, k in zip(arrays.spaces, keep)
            )
        return _Restricted(
            index_maps=tuple(keep),
            key=tuple(key_of),
            time_s=time_s,
            step_s=step_s,
            states_bytes=states,
            activations_bytes=acts,
            configs=configs,
            edges=edges,
            edge_labels=edge_labels,
            blocks=arrays.model.graph.blocks,  # type: ignore[attr-defined]
        )


def _edges_per_step(restricted: _Restricted, slots: float) -> tuple[EdgeCost, ...]:
    """The restricted edge tables scaled to a step (``slots`` micro-batch slots), kept per
    restriction and slot count: the memory search solves one restriction at many weights, which
    change only the ops' costs. Equal tables stay one array."""
    kept = _EDGES_PER_STEP.get((restricted,), dict)
    if slots not in kept:
        scaled: dict[int, np.ndarray] = {}
        edges = []
        for e in restricted.edges:
            if id(e.time_s) not in scaled:
                scaled[id(e.time_s)] = slots * e.time_s
            edges.append(EdgeCost(u=e.u, v=e.v, time_s=scaled[id(e.time_s)]))
        kept[slots] = tuple(edges)
    return kept[slots]


_EDGES_PER_STEP: IdentityMemo[dict[float, tuple[EdgeCost, ...]]] = IdentityMemo(size=8)
"""Few: the memory search works through one restriction at a time, and each entry holds its tables."""


def edge_cells(pricing: PipelinePricing, devices: int, batch: int, *, inside_node: bool | None = None,
               data_parallel: int | None = None) -> Any:
    """The (devices, batch) pair's edge tables priced at the cells its searches read (``pricing.edge_cells``:
    ``objectives.edge_cells.EdgeCells``), or ``None``: its tables are priced whole, or the pricing has no cells
    (then the whole tables are read, as before the nineteenth round). With ``inside_node`` (not ``None``), priced
    first at the search's own masks (``pricing.masks``, which hold every plan it prices: ``EdgeCells.cover_masks``)."""
    found = getattr(pricing, "edge_cells", None)
    cells = None if found is None else found(devices, batch)
    if cells is not None and inside_node is not None:
        cells.cover_masks((inside_node, data_parallel), lambda: pricing.masks(devices, batch, inside_node=inside_node,
                                                                             data_parallel=data_parallel))
    return cells


def restricted(
    pricing: PipelinePricing, devices: int, batch: int, zero_stage: int, recompute: str, *, inside_node: bool,
    data_parallel: int | None, family: tuple[tuple[str, int], Sequence[np.ndarray]] | None = None, **sync: Any,
) -> _Restricted:
    """The stage arrays restricted to the search's masks (``pricing.masks``), or with ``family =
    ((target, index), masks)`` to that family's masks; built once per pair (``pricing.derived``); ``sync``: the
    launcher's ZeRO-1/2 rule (:meth:`_Search.sync`)."""
    store = pricing.derived(devices, batch)
    mask_key = (inside_node, data_parallel, None if family is None else family[0])
    key = ("restricted", zero_stage, recompute, mask_key, *sync.values())
    if key not in store:
        # the whole edge tables only where they are priced already or the cells do not apply (objectives.edge_cells):
        # a search reads 0.8% of their cells on GPT-3 175B / 1,024 (issue 22, nineteenth round)
        arrays = pricing.arrays(devices, batch, zero_stage, recompute, edges=False, **sync)
        cells = None if arrays.edges else edge_cells(pricing, devices, batch, inside_node=inside_node,
                                                     data_parallel=data_parallel)
        if cells is None and not arrays.edges:
            arrays = pricing.arrays(devices, batch, zero_stage, recompute, **sync)
        if family is None:
            masks = pricing.masks(devices, batch, inside_node=inside_node, data_parallel=data_parallel)
        else:
            masks = list(family[1])
        # every ZeRO / recompute variant of (devices, batch) has the same edges and spaces
        shared = next((r for k, r in store.items() if k[0] == "restricted" and k[3] == mask_key), None)
        store[key] = _Restricted.build(arrays, masks, shared, cells)
    return store[key]

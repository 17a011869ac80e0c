"""A stage model's redistribution tables priced only at the configurations a pipeline search reads (issue 22,
nineteenth round of the search-speed bars).

The pipeline search reads a (stage size, micro-batch) pair's edge tables at two kinds of cells: its intra-op
problems' restricted tables (each op's rows under the search's own masks or a launcher family's, within them:
``planner.search.stage_restriction``) and the cells of each plan it prices (one configuration per op). On GPT-3
175B / 1,024 devices these are 0.8% of the cells :func:`objectives.tables.with_edges` prices (median 4.5e-6 of a
pair's), while the whole tables were 10.2 of the plan's ~64 CPU s. :class:`EdgeCells` prices each distinct
table of the pair only on the rows and columns asked so far (:meth:`EdgeCells.cover`: their union, priced again
when it grows), with the same functions and inputs as :func:`objectives.tables.with_edges` (each distinct table
by ``objectives.tables._edge_table`` with ``rows``/``cols``, which give the whole tables' cells to the bit:
``tests/objectives/test_chosen_edges.py``; the pair tables summed part by part in the same order, so the same
floats). The model's own tables are left unpriced: whatever else reads them (a row's per-op breakdown, another
entry point) prices them whole, as before.

Not used (``EdgeCells.of`` answers ``None``) where the tables are priced already, under PaSE (its tables come with
the build), or where tensor-parallel communication overlaps the GEMMs (``objectives.tables._EdgeOverlap``: the pair
tables there are overlapped as a whole; that case keeps the whole tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from objectives.cost_model import CostModel
from objectives.graph_facts import _graph_facts, _recompute_flags
from objectives.parameters import ParameterView
from objectives.tables import _build_plan, _edge_table, _EdgeOverlap
from planner.core.tables import EdgeCost

__all__ = ["EdgeCells"]


_WHOLE_SHARE = 0.25
"""A table whose rectangle would hold more than this share of its cells is priced whole, once: a small model's
searches read most of their tables (the GPT-2 README job), where growing the rectangles piece by piece costs more
calls than the cells it saves."""


@dataclass(eq=False)
class EdgeCells:
    """The edge tables of one edgeless stage model (``model``: the pair's first, which
    ``objectives.pipeline_cost.PipelineCostCache._price_edges`` would price and share with the pair's
    recompute variants), priced on rectangles that grow with what is asked."""

    model: CostModel
    plan: object
    """``objectives.tables._BuildPlan`` of the model, as :func:`objectives.tables.with_edges` builds it."""
    facts: object
    tensors: ParameterView
    row_ops: tuple[np.ndarray, ...]
    """Per distinct table ``k``, the ops whose configuration picks its uses' rows (the consumer where a pair
    reads it transposed)."""
    col_ops: tuple[np.ndarray, ...]
    shapes: tuple[tuple[int, int], ...]
    """Per distinct table, its whole shape (the configurations of its row op and column op)."""
    rows: list[np.ndarray]
    """Per distinct table, the sorted configurations of its rows priced so far."""
    cols: list[np.ndarray]
    row_at: list[np.ndarray]
    """Per distinct table, each configuration's position in :attr:`rows` (-1: not priced)."""
    col_at: list[np.ndarray]
    cells: list[np.ndarray]
    """Per distinct table, ``table[np.ix_(rows[k], cols[k])]``."""
    uses: tuple[tuple[tuple[int, int, bool], ...], ...] = ()
    """Per op pair (``plan.pairs``' order), its parts ``(k, part position, transposed)`` in summing order."""
    by_part: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...] = ()
    """Per part position ``j``, ``(pairs, tables, transposed)`` of every pair's ``j``-th part."""
    producers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    consumers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    covered: set = field(default_factory=set)
    """The keys of the masks :meth:`cover_masks` priced the tables at."""
    flat: tuple | None = None
    """:meth:`at`'s lookups, every table at once (:meth:`_flatten`; ``None`` once a table grows)."""

    @staticmethod
    def of(model: CostModel) -> "EdgeCells | None":
        """The cells of ``model`` (built without its edge tables), or ``None`` where they do not apply (module
        docstring)."""
        if model.edges_priced or model.cost_model == "pase":
            return None
        graph = model.graph
        facts = _graph_facts(graph)
        if _EdgeOverlap.of(graph, model.tables.configs, model.settings, model.cost_model, model.op_details) is not None:
            return None
        recomputed, externals = _recompute_flags(graph, facts, model.settings.recompute)
        plan = _build_plan(graph, facts, model.cost_model, model.settings, recomputed, externals)
        distinct = len(plan.edge_first)
        row_ops: list[list[int]] = [[] for _ in range(distinct)]
        col_ops: list[list[int]] = [[] for _ in range(distinct)]
        uses = []
        for (u, v), _parts, _names, sum_class in plan.pairs:
            parts = []
            for position, (k, transposed) in enumerate(plan.sum_keys[sum_class]):
                row_ops[k].append(v if transposed else u)
                col_ops[k].append(u if transposed else v)
                parts.append((k, position, transposed))
            uses.append(tuple(parts))
        longest = max((len(parts) for parts in uses), default=0)
        by_part = []
        for position in range(longest):
            at = [(e, parts[position][0], parts[position][2]) for e, parts in enumerate(uses) if len(parts) > position]
            by_part.append((np.array([a[0] for a in at], dtype=np.int64), np.array([a[1] for a in at], dtype=np.int64),
                            np.array([a[2] for a in at], dtype=bool)))
        spaces = model.tables.configs
        shapes = tuple((spaces[r[0]].size, spaces[c[0]].size) if r else (0, 0) for r, c in zip(row_ops, col_ops))
        empty = np.zeros(0, dtype=np.int64)
        return EdgeCells(
            model=model, plan=plan, facts=facts, tensors=ParameterView(graph),
            row_ops=tuple(np.unique(np.array(r, dtype=np.int64)) for r in row_ops),
            col_ops=tuple(np.unique(np.array(c, dtype=np.int64)) for c in col_ops), shapes=shapes,
            rows=[empty] * distinct, cols=[empty] * distinct,
            row_at=[np.full(shape[0], -1, dtype=np.int64) for shape in shapes],
            col_at=[np.full(shape[1], -1, dtype=np.int64) for shape in shapes],
            cells=[np.zeros((0, 0))] * distinct, uses=tuple(uses), by_part=tuple(by_part),
            producers=np.array([u for (u, _v), *_ in plan.pairs], dtype=np.int64),
            consumers=np.array([v for (_u, v), *_ in plan.pairs], dtype=np.int64),
        )

    def _price(self, k: int, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
        """Table ``k`` at ``rows`` x ``cols`` (``None``: all), as :func:`objectives.tables.with_edges` prices it."""
        model = self.model
        return _edge_table(model.graph, self.facts, self.plan.edge_first[k], model.tables.configs,  # type: ignore[attr-defined]
                           model.cluster, model.settings, model.cost_model, None, self.tensors, rows=rows, cols=cols)

    def cover(self, allowed: Sequence[np.ndarray]) -> None:
        """Price every table at least on the configurations ``allowed`` (per op, sorted indices) of its ops:
        only the new rows (at every column) and the new columns (at the old rows), each cell priced alone, so
        those priced before come out the same; a rectangle past :data:`_WHOLE_SHARE` of its table, the table."""
        for k in range(len(self.rows)):
            new_rows = _missing(self.row_at[k], [allowed[op] for op in self.row_ops[k]])
            new_cols = _missing(self.col_at[k], [allowed[op] for op in self.col_ops[k]])
            if new_rows.size or new_cols.size:
                self._grow(k, new_rows, new_cols)

    def cover_masks(self, key: object, masks: Callable[[], Sequence[np.ndarray]]) -> None:
        """:meth:`cover` at ``masks()`` (per op, a boolean mask of its configurations), once per ``key``: a search's
        own masks, which hold every plan it prices (its families' masks and plans lie within them), so that its
        reads find their cells priced in one rectangle rather than growing it plan after plan."""
        if key in self.covered:
            return
        rows: dict[int, np.ndarray] = {}  # ops share mask arrays
        self.cover([rows[id(m)] if id(m) in rows else rows.setdefault(id(m), np.flatnonzero(m)) for m in masks()])
        self.covered.add(key)

    def _grow(self, k: int, new_rows: np.ndarray, new_cols: np.ndarray) -> None:
        """Add ``new_rows`` and ``new_cols`` (not priced yet) to table ``k``'s rectangle."""
        old_rows, old_cols, old = self.rows[k], self.cols[k], self.cells[k]
        rows, cols = np.union1d(old_rows, new_rows), np.union1d(old_cols, new_cols)
        whole = self.shapes[k]
        if rows.size * cols.size > _WHOLE_SHARE * whole[0] * whole[1]:
            rows, cols = np.arange(whole[0], dtype=np.int64), np.arange(whole[1], dtype=np.int64)
            cells = self._price(k, None, None)
        else:
            cells = np.empty((rows.size, cols.size))
            at_old_rows, at_old_cols = np.searchsorted(rows, old_rows), np.searchsorted(cols, old_cols)
            cells[np.ix_(at_old_rows, at_old_cols)] = old
            if new_rows.size:  # the new rows at every column
                cells[np.searchsorted(rows, new_rows)] = self._price(k, new_rows, cols)
            added = np.setdiff1d(cols, old_cols, assume_unique=True)
            if added.size and old_rows.size:  # the old rows at the new columns
                cells[np.ix_(at_old_rows, np.searchsorted(cols, added))] = self._price(k, old_rows, added)
        self.rows[k], self.cols[k], self.cells[k] = rows, cols, cells
        self.flat = None
        self.row_at[k][rows] = np.arange(rows.size)
        self.col_at[k][cols] = np.arange(cols.size)

    def restricted(self, keep: Sequence[np.ndarray]) -> tuple[EdgeCost, ...]:
        """Every op pair's table at ``keep`` (per op, its sorted configurations), ``with_edges(model)``'s
        ``time_s[np.ix_(keep[u], keep[v])]`` to the bit, in ``plan.pairs``' order; equal tables at equal
        ``keep`` arrays are one array (as the restriction of the whole tables shares them)."""
        self.cover(keep)
        edges = []
        memo: dict[tuple[int, int, int], np.ndarray] = {}
        for ((u, v), _parts, _names, sum_class), parts in zip(self.plan.pairs, self.uses):  # type: ignore[attr-defined]
            key = (sum_class, id(keep[u]), id(keep[v]))
            if key not in memo:
                combined = None
                for k, _position, transposed in parts:  # summed in the tables' order (float rounding)
                    first, second = (keep[v], keep[u]) if transposed else (keep[u], keep[v])
                    block = self.cells[k][np.ix_(self.row_at[k][first], self.col_at[k][second])]
                    block = block.T if transposed else block
                    combined = block if combined is None else combined + block
                memo[key] = np.ascontiguousarray(combined)
            edges.append(EdgeCost(u=u, v=v, time_s=memo[key]))
        return tuple(edges)

    def at(self, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(producers, consumers, seconds)`` of every op pair at ``picks`` (one configuration per op), as
        :func:`objectives.tables.chosen_edges` gives them (the whole tables' cells, to the bit), from the cells
        priced (the picks' cells priced first where some are not): every table's cells read at once, from
        :meth:`_flatten`'s arrays (a loop over the tables per plan cost the Llama 32k job 4%)."""
        picks = np.asarray(picks, dtype=np.int64)
        flat = self.flat or self._flatten()
        row_at, row_base, col_at, col_base, cells, cell_base, widths, row_entries, col_entries = flat
        missing = np.unique(np.concatenate((
            row_entries[0][row_at[row_base[row_entries[0]] + picks[row_entries[1]]] < 0],
            col_entries[0][col_at[col_base[col_entries[0]] + picks[col_entries[1]]] < 0])))
        if missing.size:
            for k in missing.tolist():
                rows, cols = picks[self.row_ops[k]], picks[self.col_ops[k]]
                self._grow(k, np.setdiff1d(rows, self.rows[k]), np.setdiff1d(cols, self.cols[k]))
            row_at, row_base, col_at, col_base, cells, cell_base, widths, row_entries, col_entries = self._flatten()
        producers, consumers = self.producers, self.consumers
        seconds = np.zeros(producers.size)
        for position, (at, tables, transposed) in enumerate(self.by_part):
            first = np.where(transposed, picks[consumers[at]], picks[producers[at]])
            second = np.where(transposed, picks[producers[at]], picks[consumers[at]])
            row, col = row_at[row_base[tables] + first], col_at[col_base[tables] + second]
            values = cells[cell_base[tables] + row * widths[tables] + col]
            if position == 0:
                seconds[at] = values
            else:
                seconds[at] = seconds[at] + values  # summed part after part, as the tables are
        return producers.copy(), consumers.copy(), seconds

    def _flatten(self) -> tuple:
        """:attr:`flat`: the tables' row and column positions and cells laid end to end (each table's cells then a
        view of them, so they are held once), with each table's offsets and row width, and ``(tables, ops)`` of
        every (table, row op) and (table, column op) entry."""
        def ends(sizes: list[int]) -> np.ndarray:
            return np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64) if sizes else np.zeros(0, np.int64)

        cells = np.concatenate([c.ravel() for c in self.cells]) if self.cells else np.zeros(0)
        cell_base = ends([c.size for c in self.cells])
        self.cells = [cells[start:start + c.size].reshape(c.shape) for start, c in zip(cell_base.tolist(), self.cells)]
        entries = [tuple(np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64) for parts in
                         ([np.full(o.size, k) for k, o in enumerate(ops)], list(ops))) for ops in (self.row_ops, self.col_ops)]
        self.flat = (
            np.concatenate(self.row_at) if self.row_at else np.zeros(0, np.int64), ends([a.size for a in self.row_at]),
            np.concatenate(self.col_at) if self.col_at else np.zeros(0, np.int64), ends([a.size for a in self.col_at]),
            cells, cell_base, np.array([c.size for c in self.cols], dtype=np.int64), entries[0], entries[1],
        )
        return self.flat


def _missing(priced_at: np.ndarray, asked: Sequence[np.ndarray]) -> np.ndarray:
    """The sorted configurations of the index arrays ``asked`` (each distinct array once) that ``priced_at`` (each
    configuration's position, -1 where not priced) has not priced."""
    distinct = {id(a): a for a in asked}
    if not distinct:
        return np.zeros(0, dtype=np.int64)
    wanted = np.unique(np.concatenate([np.asarray(a, dtype=np.int64) for a in distinct.values()]))
    return wanted[priced_at[wanted] < 0]

r"""Repeated blocks: eliminate one block once, reuse the result for every identical block.

Variable elimination only ever combines the factors that touch the variable it eliminates. Take a
*region* :math:`R_k` of block instance :math:`k` (a set of its ops) and its *separator*
:math:`S_k` (the ops outside :math:`R_k` that share an edge with it). If the region's ops are
eliminated first, the factors they produce depend only on the unary and edge tables touching
:math:`R_k`; when instance :math:`k` is a renamed copy of a template instance :math:`t` (same arrays
under the renaming :math:`\rho_k` of :math:`R_t \cup S_t` onto :math:`R_k \cup S_k`), its
factors are the template's factors renamed. So the region is solved once, on the template, and every
other instance costs only a renaming: the produced arrays (values, argmin tables, Pareto sets and
their back-pointers) are shared, not copied. Results equal the plain elimination exactly.

For a chain of transformer layers the region is a whole layer minus the ops that feed the next
layer (:math:`B_{out}`, e.g. the residual stream's last add), and :math:`S_k = B_{out}(k-1) \cup
B_{out}(k)`: the region's result is the layer's boundary-to-boundary table
:math:`W[c_{out,k-1}, c_{out,k}] = \min_{\text{interior}} (\ldots)`, and the chain that remains is
composed by eliminating :math:`c_{out,1}, c_{out,2}, \ldots` in turn, i.e. by (min,+) products of
these tables (for the frontier, of Pareto sets per boundary pair).

Where to look:

* regions and renamings: :func:`find_regions` (checks every instance against the template, array
  by array, and keeps only instances that match; the others are eliminated normally);
* whether reuse pays: :func:`plan_elimination` (compares table cells with the plain order);
* running a plan for either search: :func:`execute_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import networkx as nx

from planner.core.memo import IdentityMemo
from planner.core.tables import CostTables
from planner.search.ordering import (
    OrderChoice,
    OrderHeuristic,
    choose_order,
    default_heuristics,
    generate_seq,
    min_cells_seq,
    order_cost,
)
from planner.search.problem import interaction_graph, oriented_edges, same_array

__all__ = [
    "Region",
    "EliminationPlan",
    "find_regions",
    "plan_elimination",
    "execute_plan",
    "Factor",
]

# Reuse a block only when its tables stay within this many times the plain order's largest table
# (and above this floor), so reuse never turns a feasible search into an out-of-memory one.
_MAX_TABLE_GROWTH = 8
_TABLE_FLOOR_CELLS = 1 << 24


@dataclass(frozen=True, slots=True, kw_only=True)
class Region:
    """One region of a block group: eliminated on the template instance, renamed onto the others."""

    group: str
    """Name of the :class:`planner.core.graph.BlockGroup`."""
    order: tuple[int, ...]
    """The template's region ops, in elimination order."""
    separator: tuple[int, ...]
    """The template's separator: ops outside the region that share an edge with it."""
    renamings: tuple[Mapping[int, int], ...]
    """Per reused instance: template op -> instance op, on region and separator."""
    max_table_cells: int
    total_table_cells: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EliminationPlan:
    """Regions to eliminate first (once each), then an order for every remaining op."""

    regions: tuple[Region, ...]
    order: tuple[int, ...]
    """Remaining ops after the regions (all ops when ``regions`` is empty)."""
    name: str
    """E.g. ``"min_cells"`` or ``"blocks+min_cells"``, or ``"given"`` for a caller's order."""
    max_table_cells: int
    total_table_cells: int
    """Cells of the plan: each region once plus the remaining order (the DP's work)."""
    plain: OrderChoice | None = None
    """The best order without block reuse, for comparison (``None`` when an order was given)."""
    eliminated_by_reuse: int = field(default=0)
    """Ops eliminated by renaming a template instead of being eliminated."""


def _eliminate_graph(adjacency: dict[int, set[int]], order: Iterable[int]) -> None:
    """Eliminate ``order`` from an adjacency dict in place (neighbours become a clique)."""
    for v in order:
        dependent = adjacency.pop(v)
        for u in dependent:
            adjacency[u] |= dependent
            adjacency[u].discard(u)
            adjacency[u].discard(v)


def _region_order(graph: nx.Graph, region: set[int], separator: set[int]) -> tuple[tuple[int, ...], int, int]:
    """Best order of ``region`` with the separator kept: every heuristic, filtered to the region."""
    sub = nx.Graph(graph.subgraph(region | separator))
    sub.remove_edges_from([(a, b) for a, b in list(sub.edges) if a in separator and b in separator])
    # The separator survives the region's elimination as one factor at most; making it a clique
    # tells networkx's heuristics so, and leaves the greedy ones (frozen) unaffected.
    clique = nx.Graph(sub)
    clique.add_edges_from((a, b) for a in separator for b in separator if a < b)
    candidates = [
        tuple(generate_seq(sub, frozen=separator)),
        tuple(min_cells_seq(sub, frozen=separator)),
    ]
    for name, heuristic in default_heuristics(clique).items():
        if name not in ("generate_seq", "min_cells"):
            candidates.append(tuple(v for v in heuristic(clique) if v in region))
    best: tuple[int, int, tuple[int, ...]] | None = None
    for order in candidates:
        worst, total = order_cost(sub, order, frozen=separator)
        if best is None or (worst, total) < best[:2]:
            best = (worst, total, order)
    assert best is not None
    return best[2], best[0], best[1]


class _Instances:
    """Positions of a block group's ops and the edges among them."""

    def __init__(self, instances: Sequence[Sequence[int]]) -> None:
        self.instances = [tuple(i) for i in instances]
        self.position: dict[int, tuple[int, int]] = {}
        for k, ops in enumerate(self.instances):
            for j, op in enumerate(ops):
                self.position[op] = (k, j)

    def valid(self) -> bool:
        width = len(self.instances[0])
        total = sum(len(i) for i in self.instances)
        return all(len(i) == width for i in self.instances) and len(self.position) == total

    def renaming(self, template: int, target: int, ops: Iterable[int]) -> dict[int, int] | None:
        """Map ops of the template (and of its neighbour instances, by offset) onto ``target``."""
        shift = target - template
        out: dict[int, int] = {}
        for op in ops:
            if op in self.position:
                k, j = self.position[op]
                if not 0 <= k + shift < len(self.instances):
                    return None
                out[op] = self.instances[k + shift][j]
            else:
                out[op] = op  # shared op outside the group (a mask, an encoder output)
        if len(set(out.values())) != len(out):
            return None
        return out


def _touching(edges: Mapping[tuple[int, int], list], region: set[int], graph: nx.Graph) -> list[tuple[int, int]]:
    pairs = {(min(a, b), max(a, b)) for r in region for a, b in ((r, n) for n in graph[r])}
    return sorted(p for p in pairs if p in edges)


def _matches(
    tables: CostTables,
    edges: Mapping[tuple[int, int], list],
    graph: nx.Graph,
    template_region: set[int],
    rho: Mapping[int, int],
) -> bool:
    """True when instance ``rho(region)`` has exactly the template's tables, renamed."""
    for r in template_region:
        s = rho[r]
        if not (
            same_array(tables.node_time_s[r], tables.node_time_s[s])
            and same_array(tables.node_memory_bytes[r], tables.node_memory_bytes[s])
        ):
            return False
    mine = _touching(edges, template_region, graph)
    theirs = _touching(edges, {rho[r] for r in template_region}, graph)
    if len(mine) != len(theirs):
        return False
    for a, b in mine:
        x, y = rho[a], rho[b]
        key = (min(x, y), max(x, y))
        if key not in edges or len(edges[key]) != len(edges[(a, b)]):
            return False
        for ours, their in zip(edges[(a, b)], edges[key]):
            if not same_array(ours, their if x < y else their.T):
                return False
    return True


def _option(
    tables: CostTables,
    edges: Mapping[tuple[int, int], list],
    graph: nx.Graph,
    info: "_Instances",
    positions: set[int],
    template: int,
    claimed_region: set[int],
    claimed_separator: set[int],
) -> tuple[Region, set[int], set[int]] | None:
    """The region at ``positions`` with ``template``, reused on every matching, disjoint instance."""
    if template >= len(info.instances):
        return None
    region = {info.instances[template][j] for j in positions}
    separator = {n for r in region for n in graph[r]} - region
    if region & (claimed_region | claimed_separator) or separator & claimed_region:
        return None
    taken_regions = set(region)
    taken_separators = set(separator)
    accepted = []
    for k in range(len(info.instances)):
        if k == template:
            continue
        rho = info.renaming(template, k, region | separator)
        if rho is None or not _matches(tables, edges, graph, region, rho):
            continue
        r_k = {rho[r] for r in region}
        s_k = {rho[s] for s in separator}
        busy_r = claimed_region | taken_regions
        busy_s = claimed_separator | taken_separators
        if r_k & (busy_r | busy_s) or s_k & busy_r:
            continue
        accepted.append(rho)
        taken_regions |= r_k
        taken_separators |= s_k
    if not accepted:
        return None
    order, worst, total = _region_order(graph, region, separator)
    built = Region(
        group="",
        order=order,
        separator=tuple(sorted(separator)),
        renamings=tuple(accepted),
        max_table_cells=worst,
        total_table_cells=total,
    )
    return built, taken_regions, taken_separators


def _apply(adjacency: dict[int, set[int]], region: Region) -> None:
    """Eliminate a region's template and every renamed instance from an adjacency dict."""
    _eliminate_graph(adjacency, region.order)
    for rho in region.renamings:
        _eliminate_graph(adjacency, [rho[v] for v in region.order])


def _as_graph(adjacency: Mapping[int, set[int]], graph: nx.Graph) -> nx.Graph:
    reduced = nx.Graph()
    for v, neighbours in adjacency.items():
        reduced.add_node(v, size=graph.nodes[v]["size"])
        reduced.add_edges_from((v, u) for u in neighbours)
    return reduced


def find_regions(tables: CostTables, graph: nx.Graph | None = None) -> tuple[Region, ...]:
    """Regions of every block group that can be solved once and reused.

    For each group, two region shapes are tried: the whole instance minus the ops that feed a later
    instance (chains of layers), and the ops with no edge leaving their instance; and two templates
    (the first and the second instance, since the first layer of a chain usually reads from
    outside). The option that leaves the least work wins (template region cells plus a greedy order
    of the rest). Instances whose tables differ from the template's, or whose region would overlap
    another region or separator, are left to the plain elimination.

    Examples
    --------
    >>> from planner.search.synthetic import transformer_tables
    >>> tables = transformer_tables(16, devices=4, batch=2, seq=4, hidden=4)
    >>> [(len(r.order), len(r.separator), len(r.renamings)) for r in find_regions(tables)]
    [(8, 2, 14)]
    """
    graph = interaction_graph(tables) if graph is None else graph
    edges = oriented_edges(tables)
    claimed_region: set[int] = set()
    claimed_separator: set[int] = set()
    adjacency = {v: set(graph[v]) - {v} for v in graph}
    regions: list[Region] = []
    for group in tables.blocks:
        info = _Instances(group.instances)
        if len(info.instances) < 2 or not info.valid():
            continue
        width = len(info.instances[0])
        feeds_later: set[int] = set()
        leaves_instance: set[int] = set()
        for op, (k, j) in info.position.items():
            for n in graph[op]:
                where = info.position.get(n)
                if where is None or where[0] != k:
                    leaves_instance.add(j)
                if where is not None and where[0] > k:
                    feeds_later.add(j)
        shapes = []
        for positions in (set(range(width)) - feeds_later, set(range(width)) - leaves_instance):
            if positions and positions not in shapes:
                shapes.append(positions)
        best: tuple[int, Region, set[int], set[int]] | None = None
        for positions in shapes:
            for template in (0, 1):
                option = _option(tables, edges, graph, info, positions, template, claimed_region, claimed_separator)
                if option is None:
                    continue
                region, taken_regions, taken_separators = option
                # score by the work left: the template once plus a cheap order of what remains
                trial = {v: set(n) for v, n in adjacency.items()}
                _apply(trial, region)
                rest = _as_graph(trial, graph)
                score = region.total_table_cells + order_cost(rest, min_cells_seq(rest))[1]
                if best is None or score < best[0]:
                    best = (score, region, taken_regions, taken_separators)
        if best is None:
            continue
        _, region, taken_regions, taken_separators = best
        claimed_region |= taken_regions
        claimed_separator |= taken_separators
        _apply(adjacency, region)
        regions.append(replace(region, group=group.name))
    return tuple(regions)


def plan_elimination(
    tables: CostTables,
    *,
    order: Sequence[int] | OrderChoice | None = None,
    use_blocks: bool = True,
    heuristics: Mapping[str, OrderHeuristic] | None = None,
) -> EliminationPlan:
    """The elimination plan both searches run: block regions first (if they pay), then an order.

    Parameters
    ----------
    tables:
        The problem.
    order:
        A caller's order of all ops (used as is, without block reuse), or ``None`` to choose.
    use_blocks:
        Try block reuse (``tables.blocks``); it is kept only when it lowers the total table cells
        without letting the largest table grow past the plain order's by more than 8x.
    heuristics:
        Order heuristics for :func:`choose_order`.

    Examples
    --------
    >>> from planner.search.synthetic import transformer_tables
    >>> plan = plan_elimination(transformer_tables(6, devices=4, batch=2, seq=4, hidden=4))
    >>> plan.name.startswith("blocks+"), plan.total_table_cells < plan.plain.total_table_cells
    (True, True)
    """
    graph = interaction_graph(tables)
    if order is not None:
        given = tuple(order.order) if isinstance(order, OrderChoice) else tuple(int(v) for v in order)
        if sorted(given) != list(range(tables.num_ops)):
            raise ValueError(f"order must list every op 0..{tables.num_ops - 1} once")
        name = order.name if isinstance(order, OrderChoice) else "given"
        worst, total = order_cost(graph, given)
        return EliminationPlan(regions=(), order=given, name=name, max_table_cells=worst, total_table_cells=total)
    plain = choose_order(graph, heuristics=heuristics)
    plain_plan = EliminationPlan(
        regions=(),
        order=plain.order,
        name=plain.name,
        max_table_cells=plain.max_table_cells,
        total_table_cells=plain.total_table_cells,
        plain=plain,
    )
    if not use_blocks or not tables.blocks:
        return plain_plan
    regions = find_regions(tables, graph)
    if not regions:
        return plain_plan
    adjacency = {v: set(graph[v]) - {v} for v in graph}
    for region in regions:
        _apply(adjacency, region)
    reused_ops = sum(len(r.order) * len(r.renamings) for r in regions)
    reduced = _as_graph(adjacency, graph)
    rest = choose_order(reduced, heuristics=heuristics)
    worst = max([rest.max_table_cells, *(r.max_table_cells for r in regions)])
    total = rest.total_table_cells + sum(r.total_table_cells for r in regions)
    limit = max(_TABLE_FLOOR_CELLS, _MAX_TABLE_GROWTH * plain.max_table_cells)
    if total >= plain.total_table_cells or worst > limit:
        return plain_plan
    return EliminationPlan(
        regions=regions,
        order=rest.order,
        name=f"blocks+{rest.name}",
        max_table_cells=worst,
        total_table_cells=total,
        plain=plain,
        eliminated_by_reuse=reused_ops,
    )


class Factor(Protocol):
    """What :func:`execute_plan` needs of a search's factor."""

    scope: tuple[int, ...]

    def renamed(self, rho: Mapping[int, int], memo: dict[int, "Factor"]) -> "Factor": ...


F = TypeVar("F", bound=Factor)


class _Store:
    """Factors by variable (bucket elimination), insertion-ordered so runs are deterministic."""

    def __init__(self) -> None:
        self.by_var: dict[int, dict[int, Factor]] = {}
        self.roots: dict[int, Factor] = {}
        self.alive: set[int] = set()

    def add(self, factor: Factor) -> None:
        key = id(factor)
        self.alive.add(key)
        if not factor.scope:
            self.roots[key] = factor
        for v in factor.scope:
            self.by_var.setdefault(v, {})[key] = factor

    def take(self, v: int) -> list[Factor]:
        found = list(self.by_var.pop(v, {}).values())
        for factor in found:
            self.alive.discard(id(factor))
            for u in factor.scope:
                if u != v:
                    self.by_var[u].pop(id(factor), None)
        return found


def _first_events(plan: EliminationPlan) -> tuple[list[int], list[bool]]:
    """Per op (list index), the rank of the first step of :func:`execute_plan` that takes its
    factors and whether that step drops them: a template's or the order's elimination uses them, a
    renamed instance's take drops them (its tables are replaced by the template's, renamed)."""
    events: dict[int, tuple[int, bool]] = {}
    for region in plan.regions:
        for v in region.order:
            events.setdefault(v, (len(events), False))
        for rho in region.renamings:
            for v in region.order:
                events.setdefault(rho[v], (len(events), True))
    for v in plan.order:
        events.setdefault(v, (len(events), False))
    size = max(events, default=-1) + 1
    rank, dropped = [len(events)] * size, [False] * size
    for v, (order, drop) in events.items():
        rank[v], dropped[v] = order, drop
    return rank, dropped


_FIRST_EVENTS: IdentityMemo[tuple[list[int], list[bool]]] = IdentityMemo(size=256)


def execute_plan(
    plan: EliminationPlan,
    factors: Sequence[F],
    eliminate: Callable[[int, list[F]], F],
) -> list[F]:
    """Run a plan: regions (template eliminated, others renamed), then the order.

    Parameters
    ----------
    plan:
        From :func:`plan_elimination`.
    factors:
        The initial factors (unary and edge tables).
    eliminate:
        ``(op, factors touching it) -> new factor`` over the op's dependent set; the new factor
        must remember how to recover the op's choice (its ``renamed`` copies too).

    Returns
    -------
    list
        The factors with an empty scope (one per connected component), in creation order.
    """
    store = _Store()
    rank, dropped = _FIRST_EVENTS.get((plan,), lambda: _first_events(plan))
    for factor in factors:
        # a factor whose first variable to go is a renamed instance's would only be taken and
        # dropped there (its instance's tables are replaced by the template's, renamed): not stored
        scope = factor.scope
        if scope:
            first = scope[0]
            for v in scope[1:]:
                if rank[v] < rank[first]:
                    first = v
            if dropped[first]:
                continue
        store.add(factor)
    for region in plan.regions:
        produced = []
        for v in region.order:
            new = eliminate(v, store.take(v))  # type: ignore[arg-type]
            store.add(new)
            produced.append(new)
        outputs = [f for f in produced if id(f) in store.alive]
        for rho in region.renamings:
            for v in region.order:
                store.take(rho[v])  # the instance's own tables: replaced by the renamed results
            memo: dict[int, Factor] = {}
            for f in outputs:
                store.add(f.renamed(rho, memo))
    for v in plan.order:
        store.add(eliminate(v, store.take(v)))  # type: ignore[arg-type]
    return list(store.roots.values())  # type: ignore[return-value]

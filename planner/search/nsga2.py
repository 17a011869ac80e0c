"""NSGA-II (pymoo): an independent, approximate (time, memory) frontier.

One integer decision variable per op with more than one configuration (range ``0..K_i-1``); ops with
a single configuration are fixed. pymoo's recipe for integer variables: random integer sampling,
SBX crossover and polynomial mutation on floats, each followed by rounding
(``RoundingRepair``), duplicates eliminated. Objectives are evaluated for the whole population at
once (:func:`planner.search.problem.evaluate_many`). The same seed gives the same frontier.

It shares no code with the elimination, so it cross-checks it (it must never find a point that
dominates the exact frontier) and reaches problems the elimination cannot; compare frontiers by
hypervolume (:func:`planner.search.pareto.hypervolume`).

References
----------
K. Deb, A. Pratap, S. Agarwal, T. Meyarivan, "A fast and elitist multiobjective genetic algorithm:
NSGA-II", IEEE TEC 6(2), 2002. pymoo 0.6: ``pymoo.algorithms.moo.nsga2.NSGA2``.
"""

from __future__ import annotations

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.pareto import pareto_mask
from planner.search.problem import check_tables, config_counts, evaluate_many
from planner.search.results import FrontierPoint, FrontierResult

__all__ = ["nsga2_frontier"]


def nsga2_frontier(
    tables: CostTables,
    *,
    seed: int = 0,
    population: int = 100,
    generations: int = 200,
    time_limit_s: float | None = None,
    initial: np.ndarray | None = None,
) -> FrontierResult:
    """Approximate (time, memory) Pareto frontier by NSGA-II.

    Parameters
    ----------
    tables:
        The search problem.
    seed:
        Random seed (same seed, same result).
    population:
        Individuals per generation.
    generations:
        Number of generations.
    time_limit_s:
        Stop after this many seconds even if generations remain (``None``: no limit). A run
        stopped by time depends on the machine's speed, so the same seed may give another frontier.
    initial:
        ``(n, num_ops)`` choices put in the first population (e.g. known baselines), the rest
        random; ``None``: all random.

    Returns
    -------
    FrontierResult
        ``method="nsga2"``, ``exact=False``, no bound (``memory_bound_factor=None``).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> front = nsga2_frontier(chain_tables([3, 3, 3], seed=1), seed=0, population=20, generations=10)
    >>> front.method, len(front.points) > 0
    ('nsga2', True)
    """
    check_tables(tables)
    if population < 2 or generations < 1:
        raise InputError(f"NSGA-II needs population >= 2 and generations >= 1 (got {population}, {generations})")
    sizes = config_counts(tables)
    free = np.flatnonzero(sizes > 1)
    if free.size == 0:
        candidates = np.zeros((1, tables.num_ops), dtype=np.int64)
    else:
        x = _evolve(
            tables, sizes, free, seed=seed, population=population, generations=generations,
            time_limit_s=time_limit_s, initial=initial,
        )  # fmt: skip
        candidates = _choices(x, sizes, free, tables.num_ops)
    time_s, memory = evaluate_many(tables, candidates)
    finite = np.isfinite(time_s) & np.isfinite(memory)
    keep = np.flatnonzero(pareto_mask(time_s, memory) & finite)
    keep = keep[np.argsort(time_s[keep], kind="stable")]
    points = tuple(
        FrontierPoint(time_s=float(time_s[i]), memory_bytes=float(memory[i]), choice=candidates[i]) for i in keep
    )
    return FrontierResult(
        points=points,
        epsilon=float("nan"),
        exact=False,
        max_table_cells=0,
        order_name="nsga2",
        method="nsga2",
        memory_bound_factor=None,
    )


def _choices(x: np.ndarray, sizes: np.ndarray, free: np.ndarray, num_ops: int) -> np.ndarray:
    """``(n, num_ops)`` choices from pymoo's ``(n, free ops)`` float variables (rounded, clipped to
    each op's configurations; ops with one configuration take it)."""
    choices = np.zeros((x.shape[0], num_ops), dtype=np.int64)
    choices[:, free] = np.clip(np.rint(x), 0, sizes[free] - 1).astype(np.int64)
    return choices


def _evolve(
    tables: CostTables,
    sizes: np.ndarray,
    free: np.ndarray,
    *,
    seed: int,
    population: int,
    generations: int,
    time_limit_s: float | None,
    initial: np.ndarray | None,
) -> np.ndarray:
    """Run pymoo's NSGA-II over the ``free`` ops' configurations; ``(population, free ops)`` floats
    of the last population."""
    from pymoo.algorithms.moo.nsga2 import NSGA2  # lazy: pymoo's import takes ~0.5 s
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.core.termination import TerminateIfAny
    from pymoo.optimize import minimize
    from pymoo.termination.max_gen import MaximumGenerationTermination
    from pymoo.termination.max_time import TimeBasedTermination

    class _Strategies(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=free.size, n_obj=2, xl=np.zeros(free.size), xu=(sizes[free] - 1).astype(float), vtype=int)

        def _evaluate(self, x, out, *args, **kwargs):  # noqa: ANN001 - pymoo's signature
            time_s, memory = evaluate_many(tables, _choices(np.asarray(x), sizes, free, tables.num_ops))
            # pymoo cannot rank infinities against each other; make them merely huge
            out["F"] = np.column_stack([np.nan_to_num(time_s, posinf=1e300), np.nan_to_num(memory, posinf=1e300)])

    sampling = IntegerRandomSampling()
    if initial is not None and len(initial):
        known = np.asarray(initial, dtype=np.int64).reshape(-1, tables.num_ops)[:population, free].astype(float)
        rng = np.random.default_rng(seed)
        extra = rng.integers(0, sizes[free], size=(population - known.shape[0], free.size)).astype(float)
        sampling = np.concatenate([known, extra])  # pymoo takes a population as an array
    algorithm = NSGA2(
        pop_size=population,
        sampling=sampling,
        crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    termination = MaximumGenerationTermination(generations)
    if time_limit_s is not None:
        termination = TerminateIfAny(termination, TimeBasedTermination(float(time_limit_s)))
    result = minimize(_Strategies(), algorithm, termination, seed=seed, verbose=False)
    return np.atleast_2d(np.asarray(result.pop.get("X"), dtype=float))

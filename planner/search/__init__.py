"""Search over cost tables: PaSE DP, the FT frontier, block reuse, the oracle, NSGA-II, baselines.

Every function takes a :class:`planner.core.tables.CostTables` and never sees ops, tensors or
clusters. Modules, one algorithm each:

* :mod:`~planner.search.ordering`: elimination orders (GENERATESEQ, networkx heuristics) and their cost;
* :mod:`~planner.search.blocks`: solve a repeated block once and reuse it; runs a plan;
* :mod:`~planner.search.elimination`: :func:`solve_min`, the exact minimum;
* :mod:`~planner.search.frontier`: :func:`pareto_frontier`, the (time, memory) frontier;
* :mod:`~planner.search.exhaustive`: the oracle for tiny problems;
* :mod:`~planner.search.nsga2`: an independent approximate frontier;
* :mod:`~planner.search.restrict`: baselines as restricted problems;
* :mod:`~planner.search.pareto`: Pareto filter, hypervolume, :func:`fastest_within`;
* :mod:`~planner.search.constrained`: :func:`fastest_within_exact`, the fastest strategy within a
  memory limit proven exact, and :func:`min_memory`, the exact least memory.
"""

from planner.search.blocks import EliminationPlan, plan_elimination
from planner.search.constrained import ConstrainedPick, fastest_within_exact, min_memory
from planner.search.elimination import solve_min
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.frontier import pareto_frontier
from planner.search.nsga2 import nsga2_frontier
from planner.search.ordering import OrderChoice, choose_order, generate_seq, networkx_order
from planner.search.pareto import fastest_within, hypervolume, pareto_mask
from planner.search.restrict import Restricted, restrict
from planner.search.results import DPResult, FrontierPoint, FrontierResult, MemoryFit

__all__ = [
    "ConstrainedPick",
    "DPResult",
    "EliminationPlan",
    "FrontierPoint",
    "FrontierResult",
    "MemoryFit",
    "OrderChoice",
    "Restricted",
    "choose_order",
    "exhaustive_frontier",
    "exhaustive_min",
    "fastest_within",
    "fastest_within_exact",
    "generate_seq",
    "hypervolume",
    "min_memory",
    "networkx_order",
    "nsga2_frontier",
    "pareto_frontier",
    "pareto_mask",
    "plan_elimination",
    "restrict",
    "solve_min",
]

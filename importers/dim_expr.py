r"""Dim expressions: the value of ``batch*seq`` or ``seq + 1`` at the caller's bindings, safely.

:func:`eval_dim_expr` evaluates a derived dim name over a whitelist of Python's ``ast`` (ints,
names, ``+ - * / // %``, ``min``/``max``/``floor``/``ceil``, and the sympy functions torch.export
writes: ``Mod``, ``FloorDiv``, ``CleanDiv``...; never ``eval``). An unknown name
raises :class:`~planner.core.errors.UnboundDimError` naming the dim, where it appears
(``input_ids[1]``) and the ``--dim`` flag.
"""

from __future__ import annotations

import ast
import math
from functools import lru_cache
from typing import Callable, Mapping

from planner.core.errors import ModelError, UnboundDimError

__all__ = ["eval_dim_expr"]

_MAX_DIM = 2**62
"""Largest dim accepted (ONNX dims are int64; products of a few such dims must still fit)."""


# --------------------------------------------------------------------------------------------
# Dim expressions
# --------------------------------------------------------------------------------------------

_BINOPS: dict[type, Callable[[int, int], int | float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Div: lambda a, b: a / b,
    ast.Mod: lambda a, b: a % b,
}
_CALLS: dict[str, Callable[..., int | float]] = {
    "min": min,
    "max": max,
    "Min": min,
    "Max": max,
    "floor": math.floor,
    "ceil": math.ceil,
    "Floor": math.floor,
    "ceiling": math.ceil,
    "Ceiling": math.ceil,
    # torch.export writes symbolic dims with the sympy functions of torch/utils/_sympy/functions.py:
    # Mod / PythonMod (Python's %, for the non-negative dims they see), FloorDiv, CleanDiv (a // b
    # known to divide evenly) and CeilToInt; e.g. Mamba-2's chunk padding 'seq + Mod(8 - Mod(seq, 8), 8)'
    "Mod": lambda a, b: a % b,
    "PythonMod": lambda a, b: a % b,
    "FloorDiv": lambda a, b: a // b,
    "CleanDiv": lambda a, b: a // b,
    "CeilToInt": math.ceil,
}


class _Unbound(Exception):
    """A name in a dim expression has no binding."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@lru_cache(maxsize=4096)
def _parse_dim(expr: str) -> ast.expr | None:
    """The whitelisted expression tree of ``expr``, or None when it is an opaque name."""
    if len(expr) > 256:
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _CALLS) or node.keywords:
                return None
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return None
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                return None
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                return None
        elif not isinstance(node, (ast.Expression, ast.Name, ast.Load) + tuple(_BINOPS)) and not (
            isinstance(node, (ast.USub, ast.UAdd))
        ):
            return None
    return tree.body


def _eval_tree(node: ast.expr, bindings: Mapping[str, int], expr: str) -> int | float:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in bindings:
            raise _Unbound(node.id)
        return bindings[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval_tree(node.operand, bindings, expr)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _eval_tree(node.left, bindings, expr)
        right = _eval_tree(node.right, bindings, expr)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ModelError(f"dim expression '{expr}' divides by zero; check the --dim values")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        args = [_eval_tree(a, bindings, expr) for a in node.args]
        try:
            return _CALLS[node.func.id](*args)  # type: ignore[union-attr]
        except ZeroDivisionError:
            raise ModelError(f"dim expression '{expr}' divides by zero; check the --dim values") from None
        except TypeError:
            raise ModelError(
                f"dim expression '{expr}' calls {node.func.id} with {len(args)} arguments; "  # type: ignore[union-attr]
                "re-export the model with plain dim names"
            ) from None
    raise ModelError(f"dim expression '{expr}' is not supported; re-export with plain dim names")


def eval_dim_expr(expr: str, bindings: Mapping[str, int], *, where: str = "") -> int:
    """Value of a symbolic ONNX dim (``dim_param``) under the given bindings.

    The text is parsed with :mod:`ast` and only integers, names, ``+ - * / // %``, unary minus and
    ``min``/``max``/``floor``/``ceil`` calls are accepted (never ``eval``); anything else is taken
    as one opaque name, looked up as a whole. A name bound as a whole (``bindings["batch*seq"]``)
    wins over evaluating it.

    Parameters
    ----------
    expr:
        The ``dim_param`` text, e.g. ``"batch"``, ``"batch*seq"``, ``"seq + 1"``.
    bindings:
        Symbolic name -> size (elements).
    where:
        Where the dim appears (``"input_ids[1]"``), for the error message.

    Returns
    -------
    int
        The dim's size in elements.

    Raises
    ------
    UnboundDimError
        A name in ``expr`` has no binding; the message names it, ``where``, and ``--dim NAME=VALUE``.
    ModelError
        The expression divides by zero or its value is not an integer.

    Examples
    --------
    >>> eval_dim_expr("batch*seq", {"batch": 2, "seq": 8})
    16
    >>> eval_dim_expr("(seq + 1) // 2", {"seq": 8})
    4
    >>> eval_dim_expr("((seq + (Mod(8 - (Mod(seq, 8)), 8)))//8)", {"seq": 13})
    2
    >>> eval_dim_expr("__import__('os')", {})
    Traceback (most recent call last):
    ...
    planner.core.errors.UnboundDimError: dim '__import__('os')' is unbound (__import__('os')); pass --dim '__import__('\\''os'\\'')=VALUE'
    """
    if expr in bindings:
        return int(bindings[expr])
    tree = _parse_dim(expr)
    try:
        if tree is None:
            raise _Unbound(expr)
        value = _eval_tree(tree, bindings, expr)
    except _Unbound as missing:
        raise UnboundDimError(missing.name, where or expr) from None
    if isinstance(value, float):
        if not value.is_integer():
            raise ModelError(
                f"dim expression '{expr}' = {value} is not an integer at "
                f"{_format_bindings(bindings, tree)}; pick --dim values it divides evenly"
            )
        value = int(value)
    return int(value)


def _try_eval_dim(expr: str, bindings: Mapping[str, int]) -> int | None:
    """Like :func:`eval_dim_expr` but None when unbound or not an integer."""
    try:
        return eval_dim_expr(expr, bindings)
    except ModelError:
        return None


def _format_bindings(bindings: Mapping[str, int], tree: ast.expr | None) -> str:
    names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}) if tree else []
    return ", ".join(f"{n}={bindings[n]}" for n in names if n in bindings) or "these bindings"

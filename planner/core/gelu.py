r"""Which GELU an ONNX node computes, from its domain, type and ``approximate`` attribute (issue 25).

One rule, two readers: the importer reads it from the file's nodes (:mod:`importers.gelu_form`), the
torch profile from the op's kept node (:mod:`objectives.torch_profile`, ``Op.node``), which may not
import the importer (tests/test_layering.py).

* ``Gelu`` in the ONNX domain (operator spec, ``Gelu``-20): ``approximate="tanh"`` -> ``gelu-tanh``,
  ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``; ``"none"`` or absent -> ``gelu-erf``, ``x Φ(x)``;
* onnxruntime's contrib ops (domain ``com.microsoft``, ``docs/ContribOperators.md``; the schemas of
  onnxruntime 1.32.0 list ``Gelu(X)``, ``BiasGelu(A, B)`` and ``FastGelu(X, bias?)``): ``Gelu`` and
  ``BiasGelu`` (``Gelu(A + B)``) are erf GELU, ``FastGelu`` the tanh approximation. ``QuickGelu``,
  ``x sigmoid(alpha x)`` (``alpha`` defaults to :data:`QUICK_GELU_ALPHA`), is no GELU form: ``None``;
* any other domain or type: ``None`` (its form is not known).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["GeluForm", "QUICK_GELU_ALPHA", "gelu_form"]

GeluForm = Literal["gelu-tanh", "gelu-erf"]
"""A GELU node's form: the tanh approximation or the exact (erf) GELU."""

QUICK_GELU_ALPHA = 1.702
"""``alpha`` of onnxruntime's ``QuickGelu`` when the node sets none (its schema's default, onnxruntime 1.32.0)."""

_CONTRIB: dict[str, GeluForm] = {"Gelu": "gelu-erf", "BiasGelu": "gelu-erf", "FastGelu": "gelu-tanh"}


def gelu_form(domain: str, op_type: str, approximate: str = "none") -> GeluForm | None:
    """The :data:`GeluForm` a node of ``op_type`` in ``domain`` computes (module docstring), ``None`` when
    it is no GELU or its form is unknown. ``approximate``: the node's attribute, ``"none"`` when absent.

    Examples
    --------
    >>> gelu_form("", "Gelu", "tanh"), gelu_form("", "Gelu"), gelu_form("com.microsoft", "FastGelu")
    ('gelu-tanh', 'gelu-erf', 'gelu-tanh')
    >>> gelu_form("com.microsoft", "QuickGelu") is None, gelu_form("org.example", "Gelu") is None
    (True, True)
    """
    if domain in ("", "ai.onnx") and op_type == "Gelu":
        return "gelu-tanh" if approximate == "tanh" else "gelu-erf"
    if domain == "com.microsoft":
        return _CONTRIB.get(op_type)
    return None

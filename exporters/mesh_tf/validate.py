r"""Mesh-TensorFlow's own checks of a mesh shape and layout rules, in pure Python (reference
``/work/shared/reference/export_targets.md`` §3.2, §3.4; ``mtf.convert_to_shape`` /
``convert_to_layout_rules``).

The rules: the same tokenizer (``[,.;]`` -> space, ``name:value``); unique mesh names, integer sizes
>= 1, their product the device count; layout rules naming existing mesh dims, each tensor dim mapped
to at most one mesh dim; per tensor, distinct dimension names, no mesh dim used twice and every
split size divisible.

:func:`mesh_tf_violations` returns every violation as a one-line message and
:func:`validate_mesh_tf` raises :class:`~planner.core.errors.UnsupportedExport` with all of them;
malformed input (a token without ``:``) raises :class:`~planner.core.errors.InputError` instead.
:mod:`exporters.validate` re-exports these names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

from planner.core.errors import InputError, UnsupportedExport

__all__ = ["MeshTensor", "parse_mesh_tf_pairs", "mesh_tf_violations", "validate_mesh_tf"]

_SEPARATORS = re.compile(r"[,.;]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshTensor:
    """A tensor as Mesh-TF lays it out: a name per dim (``None``: unnamed, never split) and sizes."""

    name: str
    dims: tuple[str | None, ...]
    shape: tuple[int, ...]


def parse_mesh_tf_pairs(text: str, *, what: str) -> list[tuple[str, str]]:
    """Split ``"b:4;m:2"`` into pairs as ``mtf.ops._parse_string_to_list_of_pairs`` does.

    Raises
    ------
    InputError
        When a token has not exactly one ``:``.

    Examples
    --------
    >>> parse_mesh_tf_pairs("batch:b;d_ff:m, heads:m", what="layout")
    [('batch', 'b'), ('d_ff', 'm'), ('heads', 'm')]
    """
    pairs = []
    for token in _SEPARATORS.sub(" ", text).split():
        parts = token.split(":")
        if len(parts) != 2:
            raise InputError(f"bad Mesh-TF {what} token '{token}'; write name:value pairs separated by ';'")
        pairs.append((parts[0], parts[1]))
    return pairs


def mesh_tf_violations(
    mesh_shape: str,
    layout: str,
    *,
    devices: int | None = None,
    tensors: Iterable[MeshTensor] = (),
) -> list[str]:
    """Every Mesh-TF rule (reference §3.2, §3.4) that the mesh and layout break.

    Parameters
    ----------
    mesh_shape:
        E.g. ``"b:4;m:2"``.
    layout:
        E.g. ``"batch:b;d_ff:m"``.
    devices:
        Devices the mesh must fill exactly (``None``: not checked).
    tensors:
        Tensors to lay out, with their dim names and sizes.
    """
    out: list[str] = []
    mesh: dict[str, int] = {}
    for name, value in parse_mesh_tf_pairs(mesh_shape, what="mesh shape"):
        try:
            size = int(value)
        except ValueError:
            out.append(f"mesh dim {name} has a non-integer size '{value}'")
            continue
        if not _IDENTIFIER.match(name):
            out.append(f"mesh dim name '{name}' is not an identifier")
        if name in mesh:
            out.append(f"mesh dim '{name}' appears twice")
        if size < 1:
            out.append(f"mesh dim {name} has size {size}; sizes must be at least 1")
        mesh[name] = size
    total = math.prod(mesh.values()) if mesh else 1
    if devices is not None and total != devices:
        out.append(f"the mesh has {total} devices, the plan needs {devices}")
    rules: dict[str, str] = {}
    for dim_name, mesh_name in parse_mesh_tf_pairs(layout, what="layout"):
        if mesh_name not in mesh:
            out.append(f"layout rule {dim_name}:{mesh_name} names no mesh dim (Mesh-TF would silently ignore it)")
            continue
        if dim_name in rules and rules[dim_name] != mesh_name:
            out.append(f"tensor dim '{dim_name}' maps to multiple mesh dims ({rules[dim_name]}, {mesh_name})")
        rules[dim_name] = mesh_name
    for tensor in tensors:
        named = [d for d in tensor.dims if d is not None]
        repeated = sorted({d for d in named if named.count(d) > 1})
        if repeated:
            out.append(f"tensor {tensor.name} repeats dimension name(s) {', '.join(repeated)} (mtf.Shape forbids it)")
        used: dict[str, str] = {}
        for dim_name, size in zip(tensor.dims, tensor.shape):
            if dim_name is None or dim_name not in rules:
                continue
            mesh_name = rules[dim_name]
            if mesh_name in used:
                out.append(
                    f"tensor {tensor.name}: dims '{used[mesh_name]}' and '{dim_name}' both map to mesh dim {mesh_name}"
                )
            used[mesh_name] = dim_name
            if size % mesh[mesh_name]:
                out.append(
                    f"tensor {tensor.name}: dim '{dim_name}' of size {size} is not divisible by mesh dim "
                    f"{mesh_name} ({mesh[mesh_name]})"
                )
    return out


def validate_mesh_tf(
    mesh_shape: str,
    layout: str,
    *,
    devices: int | None = None,
    tensors: Iterable[MeshTensor] = (),
) -> tuple[dict[str, int], dict[str, str]]:
    """Check a Mesh-TF mesh and layout; returns them parsed as ``({mesh dim: size}, {dim: mesh dim})``.

    Raises
    ------
    UnsupportedExport
        With every violated rule (see :func:`mesh_tf_violations`).

    Examples
    --------
    >>> validate_mesh_tf("b:4;m:2", "batch:b;d_ff:m", devices=8)
    ({'b': 4, 'm': 2}, {'batch': 'b', 'd_ff': 'm'})
    """
    problems = mesh_tf_violations(mesh_shape, layout, devices=devices, tensors=tensors)
    if problems:
        raise UnsupportedExport("Mesh-TensorFlow would reject this layout: " + "; ".join(problems))
    mesh = {name: int(value) for name, value in parse_mesh_tf_pairs(mesh_shape, what="mesh shape")}
    return mesh, dict(parse_mesh_tf_pairs(layout, what="layout"))

r"""Pure-Python validators of the launch plans, one per target, covering every rule the libraries enforce.

The rules and where each framework enforces them are in ``/work/shared/reference/export_targets.md``
(section numbers below); each validator returns every violation as a one-line message, and the
``validate_*`` functions raise :class:`~planner.core.errors.UnsupportedExport` with all of them.
Malformed input (an unknown flag, a token without ``:``) raises
:class:`~planner.core.errors.InputError` instead.

Megatron-LM (§1.2; ``megatron-core==0.16.1`` and Megatron-LM ``core_v0.16.1`` ``validate_args``)
    world size divisible by ``tp*pp*cp`` and by ``etp*ep*pp``; experts divisible by ``ep``; sequence
    parallelism needs ``tp > 1``; layers divisible by ``pp`` unless the stages are uneven; uneven
    first/last stages (positive, an evenly divisible middle, divisible by the virtual pipeline size);
    the pipeline layout (stages a multiple of ``pp``, embedding first and loss last, once each, one
    ``t`` per layer, not with the other split options); virtual pipeline rules (one option, ``pp > 1``,
    divisibility, micro-batches a multiple of ``pp`` for the interleaved schedule); heads divisible
    by ``tp``; query groups a multiple or a divisor of ``tp`` and dividing the heads; hidden size
    divisible by the heads unless ``--kv-channels``; ``seq % 2cp`` with context parallelism;
    ``max_position_embeddings >= seq_length``; micro batch set and global batch divisible by
    ``micro * dp``; recompute flag combinations; offload not with recompute; not fp16 and bf16;
    overlap-param-gather prerequisites; torch-FSDP2 and Megatron-FSDP prerequisites;
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with ``tp > 1`` or ``cp > 1`` (not with Megatron-FSDP).

DeepSpeed (§2; ``deepspeed==0.19.8``)
    batch sizes positive integers with ``train_batch_size == micro * accumulation * world`` (the data
    parallel size, or the full world with AutoTP); ZeRO stage 0-3 and only known keys in the strict
    sections; offload devices; not fp16 and bf16; AutoTP keys, ``autotp_size`` dividing the world,
    ZeRO <= 2 with AutoTP, heads and KV heads divisible by it; ``layer_specs`` regexes, partition
    types and sub-parameter shapes; ZeRO-2/3 not with pipeline parallelism; the ``pipeline``
    section's flags booleans and its checkpoint interval a non-negative integer.

Mesh-TensorFlow (§3.2, §3.4; ``mtf.convert_to_shape`` / ``convert_to_layout_rules``)
    the same tokenizer (``[,.;]`` -> space, ``name:value``); unique mesh names, integer sizes >= 1,
    their product the device count; layout rules naming existing mesh dims, each tensor dim mapped
    to at most one mesh dim; per tensor, distinct dimension names, no mesh dim used twice and every
    split size divisible.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from exporters.megatron.validate import (
    MEGATRON_FLAGS,
    megatron_violations,
    parse_megatron_args,
    parse_pipeline_layout,
    validate_megatron,
)
from exporters.deepspeed.validate import deepspeed_violations, validate_deepspeed
from planner.core.errors import InputError, UnsupportedExport

__all__ = [
    "MEGATRON_FLAGS",
    "parse_megatron_args",
    "parse_pipeline_layout",
    "megatron_violations",
    "validate_megatron",
    "deepspeed_violations",
    "validate_deepspeed",
    "parse_mesh_tf_pairs",
    "mesh_tf_violations",
    "validate_mesh_tf",
    "MeshTensor",
]

# ----------------------------------------------------------------------------------------------
# Mesh-TensorFlow

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

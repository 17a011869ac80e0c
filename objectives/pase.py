r"""PaSE's own cost function (Elango, IPDPS 2021, and its reference code), for reproducing the paper.

Costs are *FLOP-equivalents*, not seconds: communication of ``w`` words (8 bytes each) costs
:math:`r w` with :math:`r = \text{peak GFLOP/s} / (\text{bandwidth GB/s} / 8)`
(:class:`PaseParams`; the reference defaults 10 TFLOP/s and 16 GB/s give :math:`r = 5000`).
:mod:`objectives.tables` stores these numbers in the tables' ``time_s`` field unchanged.

Per layer (:func:`pase_node_cost`), with per-device sizes :math:`x/f_x`:

* GEMM-like ops (matmul, conv, an embedding lookup), dims classified against the two operands
  :math:`A`, :math:`B` and the output: ``k`` = reduction dims (or dims not in the output),
  batch = in :math:`A`, :math:`B` and the output, ``n`` = in :math:`B` and the output only, ``m`` =
  the rest of the output's dims (:func:`gemm_dims`):

  .. math::

      \beta\,[3mnk + 3\,pw\,mn + AR(mn, f_k) + AR(mk, f_n) + AR(nk, f_m)], \qquad
      AR(w, q) = r \cdot 2(q-1) w / q

  with :math:`\beta` the per-device product of the batch dims and :math:`pw` the fused pointwise
  ops. A convolution is that GEMM with :math:`m = b\,h_o w_o`, :math:`n = c_o`,
  :math:`k = c_i\,k_h k_w`; it never splits :math:`h`, :math:`w` (:func:`pase_config_mask`).
  The weight-gradient term :math:`AR(nk, f_m)` is reported as gradient synchronisation.
* elementwise: :math:`(1 + pw)` per device element; concat, slice, views: 0.
* norm (normalised dims :math:`N`, rows :math:`\rho` = elements / normalised elements per device):
  :math:`16 e + 4 AR(\rho, f_N) + 4 AR(e/\rho, f_{\bar N})`.
* softmax over :math:`N` (full normalised size :math:`S`):
  :math:`4 e + e S + AR(\rho, f_N) + AR(\rho S, f_N) + AR(\rho, f_N)`.
* SoftmaxCrossEntropyLoss: :math:`4 e + 2\rho + [f_N > 1]\, 2 r \rho`.
* reduce: :math:`AR(e, f_R)` over the reduced dims.
* pooling: the per-device output elements plus the halo
  :math:`r\,(b/f_b)(c/f_c)[(H/f_h + R[f_h>1])(W/f_w + S[f_w>1]) - (H/f_h)(W/f_w)]` with
  :math:`R = ` ``halo + 1`` the full window.
* anything else (rnn, opaque, gathers of activations): :math:`3 F / 2 / P`, forward and two
  backward passes of its multiply-adds, without communication.

Edges (:func:`pase_edge_cost`): :math:`2 r \max(0, \prod t^v - I)` with :math:`t` the tile sizes of
the tensor under the producer's output split and the consumer's input split,
:math:`I = \prod \min(t^u, t^v)`, or 0 when the consumer's tile count (product of the tensor's split
factors, not the layer's) exceeds the producer's. Graph inputs are free (they have no edges).

Configurations: every divisor with size/factor :math:`\ge` cutoff, any product :math:`\le p`
(:func:`pase_config_options`); Reshape/Flatten views accept only contiguous splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from objectives._common import access_dims, axis_factor_matrix, dim_mask
from planner.core.configs import ConfigOptions, ConfigSpace
from planner.core.graph import Op, Tensor, TensorAccess

__all__ = [
    "PaseParams",
    "PaseNodeCost",
    "pase_config_options",
    "pase_config_mask",
    "all_reduce_flops",
    "gemm_dims",
    "pase_node_cost",
    "pase_edge_cost",
]

_GEMM_KINDS = ("matmul", "conv", "gather", "embedding")
_FLATTEN_TYPES = ("Reshape", "Flatten")


@dataclass(frozen=True, slots=True, kw_only=True)
class PaseParams:
    """Machine constants of PaSE's cost function."""

    peak_gflops: float = 10_000.0
    """Peak compute (GFLOP/s); the reference code's default is 10 TFLOP/s."""
    bandwidth_gbs: float = 16.0
    """Link bandwidth (GB/s); the reference default is 16 GB/s."""

    @property
    def r(self) -> float:
        """FLOPs one 8-byte word of communication costs.

        Examples
        --------
        >>> PaseParams().r
        5000.0
        """
        return self.peak_gflops / (self.bandwidth_gbs / 8.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PaseNodeCost:
    """A layer's cost in FLOP-equivalents per configuration, each ``(K,)``."""

    compute: np.ndarray
    comm: np.ndarray
    """Forward partial sums and input-gradient all-reduces, statistics, halos."""
    grad_sync: np.ndarray
    """The weight-gradient all-reduce."""

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.comm + self.grad_sync


def pase_config_options(devices: int, *, cutoff: int = 4) -> ConfigOptions:
    """PaSE's configuration rule: divisors with ``size / factor >= cutoff``, any product ``<= devices``.

    ``cutoff`` is 4 in the reference code, 1 for its Transformer (so heads can be split).

    Examples
    --------
    >>> pase_config_options(8).product_rule
    'at_most'
    """
    return ConfigOptions(devices=devices, devices_per_node=devices, product_rule="at_most", min_tile=cutoff)


def _contiguous(factors: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Rows whose split is contiguous: fully split leading dims, one partly split dim, then none."""
    full = factors == sizes[None, :]
    ok = np.ones(factors.shape[0], dtype=bool)
    seen_partial = np.zeros(factors.shape[0], dtype=bool)
    for column in range(factors.shape[1]):
        split = factors[:, column] > 1
        ok &= ~(seen_partial & split)
        seen_partial |= ~full[:, column]
    return ok


def pase_config_mask(op: Op, space: ConfigSpace) -> np.ndarray:
    """``(K,)`` bool: the configurations PaSE's reference code allows for ``op``.

    Convolutions never split spatial dims; Reshape/Flatten views split contiguously only.
    """
    mask = np.ones(space.size, dtype=bool)
    if op.kind == "conv":
        spatial = np.array([d.kind == "spatial" for d in op.dims], dtype=bool)
        if spatial.any():
            mask &= np.all(space.factors[:, spatial] == 1, axis=1)
    if op.kind == "data_movement" and op.op_type in _FLATTEN_TYPES and op.dims:
        mask &= _contiguous(space.factors, np.array(op.dim_sizes, dtype=np.int64))
    return mask


def all_reduce_flops(words: np.ndarray | float, procs: np.ndarray | float, r: float) -> np.ndarray:
    r"""PaSE's ring all-reduce cost :math:`r \cdot 2(q-1) w / q` in FLOP-equivalents (0 at q = 1).

    Examples
    --------
    >>> float(all_reduce_flops(100.0, 4, 5000.0))
    750000.0
    """
    q = np.asarray(procs, dtype=np.float64)
    return r * 2.0 * (q - 1.0) * np.asarray(words, dtype=np.float64) / q


def _per_device(op: Op, space: ConfigSpace, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-device size product and factor product of the masked dims, each ``(K,)``."""
    if not mask.any():
        ones = np.ones(space.size)
        return ones, ones
    sizes = np.array(op.dim_sizes, dtype=np.float64)[mask]
    factors = space.factors[:, mask].astype(np.float64)
    return np.prod(sizes[None, :] / factors, axis=1), np.prod(factors, axis=1)


def _gemm_operands(op: Op, tensors: Mapping[str, Tensor]) -> tuple[TensorAccess, TensorAccess] | None:
    if len(op.inputs) < 2 or not op.outputs:
        return None
    params = [a for a in op.inputs if (t := tensors.get(a.tensor)) is not None and t.role == "parameter"]
    if op.kind in ("gather", "embedding") and not params:
        return None
    b = params[0] if params else op.inputs[1]
    a = next(x for x in op.inputs if x is not b)
    return a, b


def gemm_dims(op: Op, a: TensorAccess, b: TensorAccess) -> dict[str, np.ndarray]:
    """Masks ``{"batch", "m", "n", "k"}`` over ``op.dims`` (classification in the module docstring)."""
    in_a = dim_mask(op, access_dims(a))
    in_b = dim_mask(op, access_dims(b))
    in_out = dim_mask(op, access_dims(op.outputs[0]))
    reduction = np.array([d.kind == "reduction" for d in op.dims], dtype=bool)
    k = reduction | ~in_out
    batch = ~k & in_a & in_b
    n = ~k & ~batch & in_b & ~in_a
    m = ~k & ~batch & ~n
    return {"batch": batch, "m": m, "n": n, "k": k}


def _gemm_cost(op: Op, space: ConfigSpace, a: TensorAccess, b: TensorAccess, r: float) -> PaseNodeCost:
    masks = gemm_dims(op, a, b)
    beta, _ = _per_device(op, space, masks["batch"])
    m, fm = _per_device(op, space, masks["m"])
    n, fn = _per_device(op, space, masks["n"])
    k, fk = _per_device(op, space, masks["k"])
    pw = op.fused_pointwise
    compute = beta * (3.0 * m * n * k + 3.0 * pw * m * n)
    comm = beta * (all_reduce_flops(m * n, fk, r) + all_reduce_flops(m * k, fn, r))
    grad = beta * all_reduce_flops(n * k, fm, r)
    return PaseNodeCost(compute=compute, comm=comm, grad_sync=grad)


def _zeros(space: ConfigSpace) -> np.ndarray:
    return np.zeros(space.size)


def _class_mask(op: Op) -> np.ndarray:
    mask = np.array([d.kind in ("normalized", "reduction") for d in op.dims], dtype=bool)
    if not mask.any() and op.dims:
        mask[-1] = True
    return mask


def _pool_cost(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], r: float) -> PaseNodeCost:
    elements, _ = _per_device(op, space, np.ones(len(op.dims), dtype=bool))
    halo = np.zeros(space.size)
    source = next(
        (a for a in op.inputs if (t := tensors.get(a.tensor)) is not None and t.role != "parameter"), None
    )
    if source is not None:
        tensor = tensors[source.tensor]
        factors = axis_factor_matrix(space, op, source).astype(np.float64)
        shard = np.asarray(tensor.shape, dtype=np.float64)[None, :] / factors
        grown = shard.copy()
        for column, dim in enumerate(op.dims):
            if dim.kind != "spatial":
                continue
            split = space.factors[:, column] > 1
            for axis, dims in enumerate(source.axes):
                if dim.name in dims:
                    grown[:, axis] += np.where(split, dim.halo + 1, 0)
        halo = r * (np.prod(grown, axis=1) - np.prod(shard, axis=1))
    return PaseNodeCost(compute=elements, comm=halo, grad_sync=_zeros(space))


def pase_node_cost(op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], params: PaseParams) -> PaseNodeCost:
    """PaSE's layer cost of ``op`` under every configuration (formulas in the module docstring).

    Parameters
    ----------
    op, space:
        The op and its configurations.
    tensors:
        The graph's tensors (which operand is a parameter, input shapes for pooling halos).
    params:
        PaSE's machine constants.

    Returns
    -------
    PaseNodeCost
        FLOP-equivalents per configuration.
    """
    r = params.r
    all_dims = np.ones(len(op.dims), dtype=bool)
    if op.kind in _GEMM_KINDS:
        operands = _gemm_operands(op, tensors)
        if operands is not None:
            return _gemm_cost(op, space, *operands, r)
        if op.kind in ("gather", "embedding"):
            return PaseNodeCost(compute=_zeros(space), comm=_zeros(space), grad_sync=_zeros(space))
    if op.kind == "elementwise":
        elements, _ = _per_device(op, space, all_dims)
        return PaseNodeCost(compute=(1.0 + op.fused_pointwise) * elements, comm=_zeros(space), grad_sync=_zeros(space))
    if op.kind in ("concat", "slice", "data_movement"):
        return PaseNodeCost(compute=_zeros(space), comm=_zeros(space), grad_sync=_zeros(space))
    if op.kind == "softmax" and op.op_type == "SoftmaxCrossEntropyLoss":
        elements, _ = _per_device(op, space, all_dims)
        classes = _class_mask(op)
        class_pp, f_class = _per_device(op, space, classes)
        rows = elements / class_pp
        comm = np.where(f_class > 1, r * 2.0 * rows, 0.0)
        return PaseNodeCost(compute=4.0 * elements + 2.0 * rows, comm=comm, grad_sync=_zeros(space))
    if op.kind == "softmax":
        elements, _ = _per_device(op, space, all_dims)
        axis = _class_mask(op)
        axis_pp, f_axis = _per_device(op, space, axis)
        full = float(np.prod(np.array(op.dim_sizes, dtype=np.float64)[axis]))
        rows = elements / axis_pp
        compute = 4.0 * elements + elements * full
        comm = 2.0 * all_reduce_flops(rows, f_axis, r) + all_reduce_flops(rows * full, f_axis, r)
        return PaseNodeCost(compute=compute, comm=comm, grad_sync=_zeros(space))
    if op.kind == "norm":
        elements, _ = _per_device(op, space, all_dims)
        axis = _class_mask(op)
        axis_pp, f_axis = _per_device(op, space, axis)
        _, f_other = _per_device(op, space, ~axis)
        rows = elements / axis_pp
        return PaseNodeCost(
            compute=16.0 * elements,
            comm=4.0 * all_reduce_flops(rows, f_axis, r),
            grad_sync=4.0 * all_reduce_flops(axis_pp, f_other, r),
        )
    if op.kind == "reduce":
        elements, _ = _per_device(op, space, all_dims)
        reduced = np.array([d.kind in ("reduction", "normalized") for d in op.dims], dtype=bool)
        _, f_reduced = _per_device(op, space, reduced)
        return PaseNodeCost(compute=_zeros(space), comm=all_reduce_flops(elements, f_reduced, r), grad_sync=_zeros(space))
    if op.kind == "pool":
        return _pool_cost(op, space, tensors, r)
    devices = space.devices_used.astype(np.float64)
    return PaseNodeCost(compute=1.5 * op.flops / devices, comm=_zeros(space), grad_sync=_zeros(space))


def pase_edge_cost(
    shape: tuple[int, ...],
    *,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    params: PaseParams,
) -> np.ndarray:
    """``(K_u, K_v)`` FLOP-equivalents of PaSE's edge rule for one tensor (module docstring).

    Examples
    --------
    >>> from planner.core.configs import enumerate_configs
    >>> from planner.core.graph import IterDim
    >>> dims = (IterDim(name="i", size=8), IterDim(name="j", size=8))
    >>> op = Op(name="e", kind="elementwise", op_type="Relu", inputs=(), outputs=(), flops=0.0, dims=dims)
    >>> space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
    >>> acc = TensorAccess(tensor="t", axes=(("i",), ("j",)))
    >>> pase_edge_cost((8, 8), producer=op, producer_space=space, producer_access=acc, consumer=op,
    ...                consumer_space=space, consumer_access=acc, params=PaseParams()).tolist()
    [[0.0, 320000.0, 320000.0], [320000.0, 0.0, 160000.0], [320000.0, 160000.0, 0.0]]
    """
    shape_array = np.asarray(shape, dtype=np.float64)
    factors_u = axis_factor_matrix(producer_space, producer, producer_access).astype(np.float64)
    factors_v = axis_factor_matrix(consumer_space, consumer, consumer_access).astype(np.float64)
    tiles_u = shape_array[None, :] / factors_u
    tiles_v = shape_array[None, :] / factors_v
    procs_u = np.prod(factors_u, axis=1)
    procs_v = np.prod(factors_v, axis=1)
    overlap = np.ones((tiles_u.shape[0], tiles_v.shape[0]))
    for axis in range(len(shape)):
        overlap *= np.minimum(tiles_u[:, None, axis], tiles_v[None, :, axis])
    overlap = np.where(procs_v[None, :] > procs_u[:, None], 0.0, overlap)
    needed = np.prod(tiles_v, axis=1)[None, :] - overlap
    return 2.0 * params.r * np.maximum(needed, 0.0)

r"""The op graph: every operator as an iteration space (PaSE's view, generalised to any ONNX op).

An :class:`Op` is a loop nest over named iteration dims (:class:`IterDim`). Each tensor it reads or
writes is indexed by a subset of those dims: :class:`TensorAccess` maps every tensor axis to the op
dims that index it. A *configuration* of the op assigns a split factor to each dim
(:mod:`planner.core.configs`); the split of each tensor then follows from the access map.

Conventions
-----------
* ``dim`` always means an iteration or tensor dimension; ``axis`` a position in a tensor shape;
  device-mesh axes are called mesh axes.
* A tensor axis may be indexed by several op dims, outer to inner (a folded Reshape that merged
  ``heads x head_dim`` into ``hidden``): splitting the outer dim by ``f`` splits the axis
  contiguously by ``f``; splitting an inner one gives a strided layout.
* An axis indexed by no dim (a broadcast axis of size 1, or an axis the op never splits, such as a
  concatenated axis) is never split by this op.
* Sizes are element counts, FLOPs are floating-point operations (a multiply-add counts as 2),
  bytes are bytes.

Everything here is frozen: the importer builds an :class:`OpGraph` once and every later stage reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Mapping

from planner.core.units import DTYPE_BYTES

if TYPE_CHECKING:  # loaded by to_networkx only: the CLI's --help reads this module, networkx costs 0.3 CPU s
    import networkx as nx

__all__ = [
    "DimKind",
    "OpKind",
    "TensorRole",
    "IterDim",
    "TensorAccess",
    "Tensor",
    "NodeSpec",
    "Op",
    "Edge",
    "BlockGroup",
    "BatchCouplingKind",
    "BatchCoupling",
    "AttentionMask",
    "AttentionBias",
    "OpGraph",
]

DimKind = Literal["parallel", "reduction", "normalized", "spatial"]
"""How splitting an iteration dim behaves.

* ``parallel``: iterations are independent; splitting needs no communication inside the op.
* ``reduction``: summed over (MatMul's k, Conv's ci/kh/kw, ReduceSum's axes): splitting leaves
  partial sums that need an all-reduce (forward) and a matching collective in backward.
* ``normalized``: a Softmax/LayerNorm/ReduceMax axis: splitting needs a small all-reduce of
  per-row statistics (max, sum, mean/variance).
* ``spatial``: an output spatial dim of a convolution or pooling with a window: splitting needs a
  halo exchange of ``IterDim.halo`` elements per boundary.
"""

OpKind = Literal[
    "matmul",
    "conv",
    "elementwise",
    "norm",
    "softmax",
    "reduce",
    "gather",
    "embedding",
    "pool",
    "concat",
    "slice",
    "rnn",
    "data_movement",
    "opaque",
]
"""Op family, the key of per-family cost rules in ``objectives``."""

TensorRole = Literal["activation", "parameter", "input", "constant"]
"""What a tensor is: produced by an op, a trainable initializer, a graph input, or a non-trainable
constant (masks, position ids, integer initializers)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IterDim:
    """One dimension of an op's iteration space."""

    name: str
    """Unique within its op, e.g. ``"b"``, ``"m"``, ``"n"``, ``"k"``, ``"oh"``."""
    size: int
    """Number of iterations (elements)."""
    kind: DimKind = "parallel"
    """How splitting this dim behaves (see :data:`DimKind`)."""
    splittable: bool = True
    """False where the op can never split this dim (a concatenated axis, a recurrence's time)."""
    halo: int = 0
    """For ``spatial`` dims: input elements each split boundary needs from its neighbour
    (``(kernel - 1) * dilation`` for a convolution window)."""
    stride: int = 1
    """For ``spatial`` dims: input elements per output element (the window stride)."""
    is_batch: bool = False
    """True when the dim iterates over the model's samples (FlexFlow's Sample dimension): splitting
    it in every op is data parallelism."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorAccess:
    """How one tensor operand of an op is indexed by the op's iteration dims."""

    tensor: str
    """Name of the :class:`Tensor` in :attr:`OpGraph.tensors`."""
    axes: tuple[tuple[str, ...], ...]
    """For each tensor axis, the op dims that index it, outer to inner; ``()`` means the axis is
    never split by this op (broadcast, size 1, or not splittable)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    """A tensor of the model, at the bound dims."""

    name: str
    shape: tuple[int, ...]
    """Concrete shape (symbolic dims bound)."""
    dtype: str
    """numpy-style dtype name, e.g. ``"float32"``, ``"int64"``."""
    role: TensorRole
    producer: str | None = None
    """Name of the op that writes it, ``None`` for parameters, inputs and constants."""

    @property
    def num_elements(self) -> int:
        """Number of elements (1 for a scalar)."""
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES.get(self.dtype, 4)

    @property
    def num_bytes(self) -> int:
        """Bytes of the whole tensor."""
        return self.num_elements * self.itemsize


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """Enough of an ONNX node to rebuild it as a one-node model (for onnxruntime profiling).

    Attributes are kept as serialized ``onnx.AttributeProto`` bytes so ``planner.core`` does not
    depend on onnx.
    """

    op_type: str
    domain: str = ""
    attributes: tuple[bytes, ...] = ()
    input_shapes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()
    constant_inputs: Mapping[int, bytes] = field(default_factory=dict)
    """Inputs that must be constant for the op to run (Reshape's shape, Slice's starts...), as
    serialized ``onnx.TensorProto`` bytes, by input position."""
    opset: int = 18
    input_axes: tuple[tuple[tuple[str, ...], ...] | None, ...] = ()
    """Optional, for the profiler: for each main-node input, the op dims indexing each of its axes
    as the main node sees it (after any folded view), outer to inner; ``None`` for a constant input.
    ``()`` when not given: the profiler then matches inputs to :attr:`Op.inputs` by shape."""
    output_axes: tuple[tuple[tuple[str, ...], ...] | None, ...] = ()
    """Optional, like :attr:`input_axes` for the main node's outputs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """A coarse operator: one meaningful ONNX node plus the views and elementwise ops folded into it."""

    name: str
    """Unique name (the main ONNX node's name)."""
    kind: OpKind
    op_type: str
    """ONNX op type of the main node (``MatMul``, ``Conv``...)."""
    dims: tuple[IterDim, ...]
    inputs: tuple[TensorAccess, ...]
    """Operands read: activations, graph inputs and parameters (constants are left out)."""
    outputs: tuple[TensorAccess, ...]
    flops: float
    """Forward FLOPs of the whole op at full size, fused elementwise ops included."""
    backward_flops_factor: float = 2.0
    """Backward FLOPs / forward FLOPs (matmul-like: 2, one GEMM each for input and weight grads;
    elementwise: about 1; ops without trainable inputs on an input-only path still propagate)."""
    fused_pointwise: int = 0
    """Number of elementwise ONNX ops fused into this op (PaSE's ``pw``)."""
    onnx_nodes: tuple[str, ...] = ()
    """Names of every ONNX node this coarse op stands for (main node first)."""
    node_types: tuple[str, ...] = ()
    """ONNX op types of the nodes in :attr:`onnx_nodes` (the main one included), in graph order, which
    is the order they run: the last writes the op's output (a folded ReLU after a BatchNorm or a residual
    Add; the main node itself when only a prologue was folded). ``()`` when not recorded. The memory
    model asks it whether the op's last node saves its result (``Relu``) or its input (a GeLU's ``Mul``)."""
    module_path: str | None = None
    """Module path from exporter metadata, e.g. ``transformer.h.0.attn`` (``None`` if unknown)."""
    node: NodeSpec | None = None
    """The main node, for profiling; ``None`` for ops that cannot run alone."""
    note: str = ""
    """Why the op is opaque or otherwise special (shown to users)."""

    def dim(self, name: str) -> IterDim:
        """The iteration dim called ``name``."""
        for dim in self.dims:
            if dim.name == name:
                return dim
        raise KeyError(f"op {self.name} has no dim '{name}'")

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(dim.name for dim in self.dims)

    @property
    def dim_sizes(self) -> tuple[int, ...]:
        return tuple(dim.size for dim in self.dims)

    def signature(self) -> tuple:
        """A hashable key equal for ops that cost the same under every configuration
        (same family, dims and operand layouts), used to share cost tables between repeated blocks."""
        return (
            self.kind,
            self.op_type,
            self.dims,
            tuple((len(a.axes), a.axes) for a in self.inputs),
            tuple((len(a.axes), a.axes) for a in self.outputs),
            self.flops,
            self.backward_flops_factor,
            self.fused_pointwise,
            self.node_types,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    """Data flowing from one op to another through a tensor."""

    producer: int
    """Index of the producing op in :attr:`OpGraph.ops`."""
    consumer: int
    """Index of the consuming op."""
    tensor: str
    producer_output: int
    """Position of the tensor in the producer's outputs."""
    consumer_input: int
    """Position of the tensor in the consumer's inputs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockGroup:
    """A set of repeated, structurally identical blocks (e.g. the transformer layers).

    ``instances[i][j]`` is the index (in :attr:`OpGraph.ops`) of the j-th op of the i-th instance;
    op j of every instance has the same :meth:`Op.signature`, and the edges inside each instance
    correspond. Instances are listed in graph order.
    """

    name: str
    """E.g. ``transformer.h`` (the common module-path prefix) or ``block0``."""
    instances: tuple[tuple[int, ...], ...]


BatchCouplingKind = Literal["similarity", "batch_norm", "indexed"]
"""How an op reads across the samples of the batch (:class:`BatchCoupling`).

* ``similarity``: a MatMul whose output is batch x batch (CLIP's ``image_emb @ text_emb^T``, the
  logits of a contrastive loss): each sample's loss depends on every other sample of the batch, so
  micro-batches change the objective.
* ``batch_norm``: BatchNormalization, whose training statistics are means over the batch (per
  data-parallel rank and micro-batch, as DDP runs it without SyncBatchNorm).
* ``indexed``: the batch dim is not a sample dim: a Gather/Scatter indexes across it with indices
  from an input that does not carry it (a graph's nodes, indexed by ``edge_index``, in a GNN).
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchCoupling:
    """An op that reads across the samples of the batch, so splitting the batch changes what it computes."""

    op: str
    """The op's name (``indexed``: the ONNX node's)."""
    kind: BatchCouplingKind
    reason: str
    """Why, in words for the table's note (e.g. ``"batch x batch similarity of its two operands"``)."""
    dim: str = ""
    """``indexed``: the file's name of the batch dim read across (``"nodes"`` in a GNN), which is then not a sample
    dim, so exporters name it so rather than ``batch``; ``""`` for the other kinds."""


AttentionMask = Literal["causal", "bidirectional", "unknown"]
"""Which keys each query of an attention sees (:attr:`OpGraph.attention_masks`, read by
:mod:`importers.attention_masks`): ``causal`` a set of its own (a mask comparing query and key
positions: causal, sliding window), ``bidirectional`` every key (no mask, or a per-key padding mask),
``unknown`` not proven either way (a constant or caller-given ``[s, s]`` mask, a relative-position bias)."""

AttentionBias = Literal["alibi"]
"""A position bias added to an attention's scores (:attr:`OpGraph.attention_biases`, read by
:mod:`importers.attention_masks`): ``alibi`` per-head slopes times key positions (BLOOM, MPT)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpGraph:
    """A model as coarse ops over named tensors, with concrete shapes."""

    name: str
    """Model name (file stem)."""
    ops: tuple[Op, ...]
    """In topological order."""
    tensors: Mapping[str, Tensor]
    edges: tuple[Edge, ...]
    blocks: tuple[BlockGroup, ...] = ()
    dim_bindings: Mapping[str, int] = field(default_factory=dict)
    """Symbolic dim values used, e.g. ``{"batch": 32, "seq": 1024}``."""
    raw_node_count: int = 0
    """ONNX nodes in the file (before coarsening)."""
    opset: int = 0
    source_sha256: str = ""
    """SHA-256 of the ONNX file's bytes."""
    source_path: str = ""
    warnings: tuple[str, ...] = ()
    """Import warnings (opaque ops, contradicting declared shapes...)."""
    parameter_aliases: Mapping[str, str] = field(default_factory=dict)
    """Tied weights: alias name -> canonical parameter name (counted once)."""
    raw_op_types: Mapping[str, int] = field(default_factory=dict)
    """ONNX op type -> number of nodes of that type in the file (before coarsening)."""
    batch_coupled: tuple[BatchCoupling, ...] = ()
    """Ops that read across the samples of the batch (:mod:`importers.batch_coupling`); the search
    keeps a contrastive loss out of micro-batching and refuses to scale a batch dim that is not a
    sample dim (:mod:`planner.coupling`)."""
    attention_masks: Mapping[str, AttentionMask] = field(default_factory=dict)
    """Softmax op name -> :data:`AttentionMask`, from the ONNX nodes that mask the scores
    (:mod:`importers.attention_masks`); a softmax not listed is ``unknown``."""
    attention_biases: Mapping[str, AttentionBias] = field(default_factory=dict)
    """Softmax op name -> :data:`AttentionBias` for the attentions whose scores get a position bias
    (:mod:`importers.attention_masks`); a softmax not listed has none the importer recognised."""
    attention_windows: Mapping[str, int] = field(default_factory=dict)
    """Softmax ONNX node name -> the sliding window :math:`W` (tokens: each query sees itself and the
    :math:`W - 1` keys before it) of the attentions whose causal mask is windowed
    (:mod:`importers.sliding_window`); a softmax not listed sees every earlier key."""
    attention_bands: Mapping[str, int] = field(default_factory=dict)
    """Softmax ONNX node name -> the half-width :math:`w` of a two-sided window (each query sees the keys
    within :math:`w` positions of it on either side, :math:`2 w + 1` of them: an encoder's local attention,
    ModernBERT's) (:mod:`importers.sliding_window`); a softmax not listed has no two-sided window."""

    def op_index(self, name: str) -> int:
        """Index of the op called ``name``."""
        for index, op in enumerate(self.ops):
            if op.name == name:
                return index
        raise KeyError(name)

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """Trainable parameters, each tied weight once."""
        return tuple(t for t in self.tensors.values() if t.role == "parameter")

    @property
    def parameter_count(self) -> int:
        """Total trainable parameter elements (tied weights counted once)."""
        return sum(t.num_elements for t in self.parameters)

    @property
    def opaque_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.kind == "opaque")

    def forward_flops(self) -> float:
        """Forward FLOPs of one step at the bound dims."""
        return float(sum(op.flops for op in self.ops))

    def training_flops(self) -> float:
        """Forward + backward FLOPs of one training step at the bound dims."""
        return float(sum(op.flops * (1.0 + op.backward_flops_factor) for op in self.ops))

    def to_networkx(self) -> nx.MultiDiGraph:
        """The op graph as a networkx multigraph: nodes are op indices, edges carry ``tensor``."""
        import networkx as nx

        graph = nx.MultiDiGraph()
        graph.add_nodes_from(range(len(self.ops)))
        for edge in self.edges:
            graph.add_edge(edge.producer, edge.consumer, tensor=edge.tensor)
        return graph

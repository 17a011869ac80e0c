r"""Concrete shapes for every value of an ONNX graph, at the caller's dim bindings.

Contract (used by the coarsening stage): :func:`resolve_shapes` returns a :class:`ShapedModel`.

How shapes are found, in order of trust (computed beats declared: exports can declare wrong shapes,
e.g. an LSTM LM whose output declares ``[batch, 128, vocab]`` with the traced seq baked in):

0. **Validate** the graph: a topological order (dangling inputs, cycles and values produced twice
   are ModelErrors) and each standard op against its schema, because ONNX's C++ inference aborts
   the process on some malformed nodes. → :mod:`importers.shape_inputs`
1. **Bind** graph-input dims from ``dims`` (``{"batch": 32, "seq": 1024}``); derived names such as
   ``batch*seq`` or ``seq + 1`` are evaluated by :func:`~importers.dim_expr.eval_dim_expr` (a whitelist over Python's
   ``ast``: ints, names, ``+ - * / // %``, ``min``/``max``/``floor``/``ceil``; never ``eval``).
   An unknown name raises :class:`~planner.core.errors.UnboundDimError` naming the dim, where it
   appears (``input_ids[1]``) and the ``--dim`` flag. → :mod:`importers.shape_inputs`
2. **Infer** on a *skeleton* of the model: graph inputs made concrete, big or external initializers
   turned into graph inputs of the same dtype and dims (so no weight bytes are copied and
   onnxruntime's symbolic inference, which reads initializer data, works on stripped files), graph
   outputs' declared shapes dropped. ``onnx.shape_inference.infer_shapes(data_prop=True)``. →
   :mod:`importers.shape_inference`
3. **Fold** shape-computation subgraphs in topological order (Shape, Gather, Concat, Slice, Cast,
   integer arithmetic, Range, ConstantOfShape, Where, Expand...) with numpy, or with
   ``onnx.reference.ReferenceEvaluator`` for other ops on tiny constant inputs. Folded values go to
   :attr:`ShapedModel.constants` and are injected into the next skeleton as initializers, so
   Reshape/Expand/Slice targets that ONNX's data propagation misses (e.g. after a ``Div``) become
   known. Steps 2-3 repeat while they make progress (``_Resolver``, here). → :mod:`importers.const_fold`
4. **Fall back** for values still unknown: declared ``value_info`` made concrete by the bindings is
   fed to inference for exactly those values (so downstream inference resumes; this is what a
   graph-only file whose shape constants were stripped needs), then onnxruntime's
   ``SymbolicShapeInference`` when a ``com.microsoft``-style op is where inference stopped (it
   needs sympy, and is skipped without it). → :mod:`importers.shape_inference`
5. **Check**: computed shapes that contradict declared ones become warnings; a negative dim of a
   non-integer runtime value (an activation, not an empty index vector of a shape subgraph), or a
   zero dim of one that does not only feed Concats (a full rotary's empty pass-through half),
   is a :class:`~planner.core.errors.ModelError`; values whose shape stays
   unknown are left out of :attr:`ShapedModel.shapes` with one warning.

Everything is linear in the graph size (a few inference calls, one topological order, dict
lookups); ``onnx.checker.check_model`` is never called (only the per-node ``check_node``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from importers.const_fold import FOLD_MAX_ELEMENTS, _fold_pass
from importers.dim_expr import _MAX_DIM, eval_dim_expr
from importers.onnx_load import printable
from importers.onnx_protos import _DEFAULT_DOMAINS, _dtype_name, _limited, _tensor_type
from importers.shape_facts import solve_shapes
from importers.shape_inference import _MAX_ROUNDS, _Decl, _declared, _harvest, _infer, _ort_infer, _Parts, _skeleton
from importers.shape_inputs import _bind_inputs, _check_dims, _input_dim_names, _topo_order, _validate_nodes
from planner.core.errors import ModelError, PlannerError

__all__ = ["ShapedModel", "resolve_shapes", "eval_dim_expr", "FOLD_MAX_ELEMENTS"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapedModel:
    """An ONNX model with every value's concrete shape and dtype."""

    model: onnx.ModelProto
    """As loaded, weights not loaded (``load_external_data=False``)."""
    shapes: Mapping[str, tuple[int, ...]]
    """Value name (node outputs, graph inputs, initializers) -> concrete shape."""
    dtypes: Mapping[str, str]
    """Value name -> numpy dtype name (``"float32"``, ``"int64"``...)."""
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Values known at import time: Constant nodes, small inline initializers, and results of
    shape-computation subgraphs (Shape -> Gather -> Concat...), by value name."""
    dim_bindings: Mapping[str, int] = field(default_factory=dict)
    """The bindings used, symbolic name -> value (derived ones such as ``batch*seq`` included)."""
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def resolve_shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> ShapedModel:
    """Concrete shape and dtype of every value of ``model`` at the given dim bindings.

    See the module docstring for the order of sources (inference on a weightless skeleton, constant
    folding, declared ``value_info``, onnxruntime's symbolic inference) and the checks.

    Parameters
    ----------
    model:
        The model as loaded by :func:`importers.onnx_load.load_onnx` (weights need not be present).
    dims:
        Symbolic dim name -> size in elements, e.g. ``{"batch": 32, "seq": 1024}``. A dim with no
        name may be bound by position, ``{"input_ids[1]": 1024}``. Unused names are ignored.

    Returns
    -------
    ShapedModel
        Shapes of graph inputs, initializers and node outputs (values whose shape cannot be
        computed are left out, with a warning), numpy dtype names, folded constants, the bindings
        used (derived dims included) and warnings (declared shapes contradicting computed ones).

    Raises
    ------
    UnboundDimError
        A graph input dim has no binding (names the dim, where it appears, and ``--dim NAME=VALUE``).
    ModelError
        A non-positive dim (bound or computed), a dangling input, a cycle, a value produced twice.

    Examples
    --------
    >>> from onnx import helper, TensorProto
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch*seq", 8])
    >>> nodes = [
    ...     helper.make_node("Constant", [], ["shape"], value_ints=[-1, 8]),
    ...     helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ... ]
    >>> m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
    ...                       opset_imports=[helper.make_opsetid("", 18)])
    >>> shaped = resolve_shapes(m, {"batch": 2, "seq": 16})
    >>> shaped.shapes["y"], shaped.dtypes["y"], shaped.dim_bindings["batch*seq"]
    ((32, 8), 'float32', 32)
    """
    try:
        resolver = _Resolver(model, _check_dims(dims))
        resolver.iterate()
        return resolver.result()
    except PlannerError as exc:
        # Names in a corrupt file may hold newlines or control characters: keep messages one line.
        exc.args = (printable(str(exc)),)
        raise


_SMALL_CONST_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
    }
)


_PROBE_PRIMES = (211, 223, 227, 229, 233, 239, 241, 251, 257, 263, 269, 271)
"""Probe values for the bound dims (:meth:`_Resolver._probe`): primes above any head count and
head size, and no factor of the usual hidden sizes and vocabularies (768, 4096, 32000, 50257...),
small enough that a probe's attention mask (batch x seq x seq) stays a few MB (primes near 10^4
made some exports ask for 14 GB)."""


def _unprobe(value: int, probes: Mapping[str, int], bindings: Mapping[str, int], literals: set[int]) -> int | None:
    """A dim computed at probe bindings, at the caller's bindings (each probe prime replaced).

    ``None`` when what is left after dividing out the primes is not a plausible literal (below the
    smallest prime, or a dim written in the file): ``seq + 1`` at the probe is 224, which is no
    product of bound dims.

    >>> _unprobe(4 * 211 * 223, {"batch": 211, "seq": 223}, {"batch": 2, "seq": 16}, set())
    128
    >>> _unprobe(224, {"seq": 223}, {"seq": 16}, set()) is None
    True
    """
    result = 1
    for name, prime in probes.items():
        while value % prime == 0 and value > 0:
            value //= prime
            result *= bindings[name]
    if value <= 0 or (value >= _PROBE_PRIMES[0] and value not in literals):
        return None
    return result * value


class _Resolver:
    """State of one :func:`resolve_shapes` call (private; every field is filled in ``__init__``)."""

    def __init__(self, model: onnx.ModelProto, bindings: dict[str, int]) -> None:
        self.model = model
        self.graph = graph = model.graph
        self.bindings = bindings
        self.warn: list[str] = []
        self.init_names = {t.name for t in graph.initializer}
        sparse = {t.values.name: t for t in graph.sparse_initializer}
        real_inputs = [
            vi for vi in graph.input if vi.name not in self.init_names and vi.name not in sparse
        ]
        sources = {vi.name for vi in real_inputs} | self.init_names | set(sparse)
        self.order = _topo_order(graph, sources)
        _validate_nodes(model)
        self.producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
        consumed = {name for node in graph.node for name in node.input if name}
        consumed.update(vi.name for vi in graph.output)

        self.derived: dict[str, int] = {}
        input_shapes, input_vis = _bind_inputs(
            real_inputs, bindings, self.derived, consumed, self.warn
        )
        unknown = sorted(set(bindings) - _input_dim_names(real_inputs))
        if unknown:
            known = sorted(_input_dim_names(real_inputs, positional=False))
            # an exporter that specialised a dim (torch.export over a loop of the tokens) wrote it as a number
            fixed = [f"{vi.name}[{k}] = {d.dim_value}" for vi in real_inputs if (tt := _tensor_type(vi)) is not None
                     for k, d in enumerate(tt.shape.dim) if d.HasField("dim_value") and d.dim_value > 1][:3]
            also = (f"; fixed in the file: {', '.join(fixed)}, so planning another size needs a re-export with that "
                    "axis dynamic") if fixed else ""
            self.warn.append(
                f"--dim {', '.join(unknown)}: not a dim of the model's inputs, ignored (its named dims: "
                f"{', '.join(known) or 'none'}{also}); check the spelling"
            )
        self.shapes: dict[str, tuple[int, ...]] = dict(input_shapes)
        self.types: dict[str, int] = {}
        for vi in real_inputs:
            tt = _tensor_type(vi)
            if tt is not None and tt.elem_type:
                self.types[vi.name] = tt.elem_type

        # Initializers: small integer ones (and scalars) are constants and stay inline in the
        # skeleton; everything else becomes a typed graph input there, so no weight bytes are
        # copied and nothing reads data that a stripped file lacks.
        self.constants: dict[str, np.ndarray] = {}
        inline: list[onnx.TensorProto] = []
        skel_inputs = [input_vis.get(vi.name, vi) for vi in real_inputs]
        for tensor in graph.initializer:
            tdims = tuple(int(d) for d in tensor.dims)
            if any(d < 0 for d in tdims):
                raise ModelError(
                    f"initializer '{tensor.name}' has a negative dim {list(tdims)}; the file is "
                    "corrupt: re-export it"
                )
            self.shapes[tensor.name] = tdims
            self.types[tensor.name] = tensor.data_type
            size = math.prod(tdims)
            small_int = tensor.data_type in _SMALL_CONST_TYPES and size <= FOLD_MAX_ELEMENTS
            if tensor.data_location != TensorProto.EXTERNAL and (small_int or size <= 1):
                try:
                    self.constants[tensor.name] = numpy_helper.to_array(tensor)
                    inline.append(tensor)
                    continue
                except Exception:  # data that does not match dims/dtype in a corrupt file
                    self.warn.append(
                        f"initializer '{tensor.name}' has data that does not match its dims and "
                        "dtype; its values are ignored"
                    )
            skel_inputs.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tdims))
        for name, sp in sparse.items():
            sdims = tuple(int(d) for d in sp.dims)
            self.shapes[name] = sdims
            self.types[name] = sp.values.data_type
            skel_inputs.append(helper.make_tensor_value_info(name, sp.values.data_type, sdims))

        self.computed: dict[str, tuple[int, ...]] = {}
        dropped = self._stripped_constants(skel_inputs)

        out_vis = []
        for vi in graph.output:
            tt = _tensor_type(vi)
            out_vis.append(
                helper.make_tensor_value_info(vi.name, tt.elem_type, None)
                if tt is not None
                else helper.make_empty_tensor_value_info(vi.name)
            )
        self.parts = _Parts(
            inputs=skel_inputs, initializers=inline, outputs=out_vis, dropped_nodes=dropped
        )
        self.declared = _declared(graph, bindings | self.derived, self.derived)
        self.node_outputs = [o for i in self.order for o in graph.node[i].output if o]
        self.node_output_set = set(self.node_outputs)
        self.folded: dict[str, np.ndarray] = {}
        self.done: set[int] = set()
        self.declared_fed: list[str] = []
        self.facts_fed: list[str] = []

    def _stripped_constants(self, skel_inputs: list) -> set[int]:
        """Constant nodes whose data was stripped to an external file become typed inputs of the
        skeleton too (appended to ``skel_inputs``, shapes in :attr:`computed`); their node indices."""
        dropped: set[int] = set()
        for i, node in enumerate(self.graph.node):
            if node.op_type != "Constant" or node.domain not in _DEFAULT_DOMAINS or not node.output:
                continue
            for a in node.attribute:
                if a.name == "value" and a.t.data_location == TensorProto.EXTERNAL:
                    tdims = tuple(int(d) for d in a.t.dims)
                    dropped.add(i)
                    self.computed[node.output[0]] = tdims
                    self.types[node.output[0]] = a.t.data_type
                    skel_inputs.append(helper.make_tensor_value_info(node.output[0], a.t.data_type, tdims))
        return dropped

    # -- helpers -------------------------------------------------------------------------------

    def known_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.constants:
            return tuple(self.constants[name].shape)
        if name in self.computed:
            return self.computed[name]
        return self.shapes.get(name)

    def missing(self) -> list[str]:
        return [o for o in self.node_outputs if o not in self.folded and o not in self.computed]

    def skeleton_inputs(self) -> tuple[set[int], dict[str, np.ndarray]]:
        """Nodes replaced by their folded values, and the folded values the rest still reads."""
        nodes = self.graph.node
        removed = {
            i for i in self.order if nodes[i].output and all(o in self.folded for o in nodes[i].output if o)
        }
        needed = {n for i, node in enumerate(nodes) if i not in removed for n in node.input if n}
        needed.update(vi.name for vi in self.graph.output)
        injected = {
            n: v for n, v in self.folded.items() if n in needed and n not in self.init_names
        }
        return removed, injected

    def merge(self, inferred: onnx.ModelProto | None, *, only_new: bool = False) -> bool:
        """Take concrete shapes (and dtypes) of node outputs from an inferred model."""
        if inferred is None:
            return False
        got, got_types = _harvest(inferred)
        gained = False
        for name, shape in got.items():
            if name not in self.node_output_set or name in self.folded:
                continue
            if only_new and name in self.computed:
                continue
            gained |= name not in self.computed
            self.computed[name] = shape
        for name, t in got_types.items():
            self.types.setdefault(name, t)
        return gained

    def fold(self) -> None:
        _fold_pass(self.model, self.order, self.done, self.constants, self.folded, self.known_shape)

    # -- the rounds ----------------------------------------------------------------------------

    def iterate(self, *, facts: bool = True) -> None:
        """Infer, fold, and feed folded values back until no more shapes can be found."""
        use_declared = False
        ort_tried = False
        facts_tried = not facts
        extra: list[onnx.ValueInfoProto] = []
        for _ in range(_MAX_ROUNDS):
            removed, injected = self.skeleton_inputs()
            skel = _skeleton(self.model, self.parts, removed, injected, extra)
            self.merge(_infer(skel, self.warn))
            self.fold()
            missing = self.missing()
            if not missing:
                return
            if self.skeleton_inputs()[1].keys() - injected.keys():
                continue  # newly folded Reshape/Expand/Slice arguments: infer again with them
            if not use_declared:
                extra = _declared_vis(self.declared, missing, self.types)
                if extra:
                    use_declared = True
                    self.declared_fed = [vi.name for vi in extra]
                    continue
            # onnxruntime's inference only adds knowledge of its own (com.microsoft) ops, and it
            # is slow Python: run it only when such an op is where inference stopped.
            if not ort_tried and any(
                self.graph.node[self.producer[o]].domain not in _DEFAULT_DOMAINS for o in missing
            ):
                ort_tried = True
                if self.merge(_ort_infer(skel), only_new=True):
                    self.fold()
                    if self.missing() and self.skeleton_inputs()[1].keys() - injected.keys():
                        continue
            # Last: shapes the graph's structure alone determines (a graph-only file whose shape
            # constants were stripped), fed back so that inference resumes after them.
            if not facts_tried:
                facts_tried = True
                solved = self.solve_from_facts()
                if solved:
                    extra = extra + solved
                    self.facts_fed = [vi.name for vi in solved]
                    continue
            return

    def _facts(self) -> dict[str, tuple[int, ...]]:
        """:func:`solve_shapes` on what this resolver knows."""
        known: dict[str, tuple[int, ...]] = dict(self.shapes)
        known.update(self.computed)
        known.update({n: tuple(v.shape) for n, v in self.folded.items()})
        known.update({n: tuple(v.shape) for n, v in self.constants.items()})
        partial = {
            name: decl.values
            for name, decl in self.declared.items()
            if decl.values is not None and name not in known
        }
        return solve_shapes(self.graph, self.order, known, partial)

    def _probe(self, names: set[str]) -> dict[str, tuple[int, ...]]:
        """Shapes of ``names`` solved at probe bindings (distinct large primes), mapped back.

        At the caller's dims two shapes can both fit the facts by coincidence (seq 16 and 16 heads
        make ``[2, 16, 1024]`` as consistent as ``[32, 16, 64]``); at pairwise distinct primes only
        the structural answer does, and each of its dims, factored by the primes, is the same
        product of the caller's dims.
        """
        if not self.bindings or len(self.bindings) > len(_PROBE_PRIMES):
            return {}
        probes = dict(zip(sorted(self.bindings), _PROBE_PRIMES))
        try:
            other = _Resolver(self.model, probes)
            other.iterate(facts=False)
            solved = other._facts()
        except PlannerError:
            return {}
        literals = {int(d) for t in self.graph.initializer for d in t.dims}
        for decl in self.declared.values():
            literals.update(int(v) for v, text in zip(decl.values or (), decl.texts) if text.isdigit() and v is not None)
        back: dict[str, tuple[int, ...]] = {}
        for name in names:
            shape = solved.get(name) or other.computed.get(name)
            if shape is None:
                continue
            dims = [_unprobe(d, probes, self.bindings, literals) for d in shape]
            if all(d is not None for d in dims):
                back[name] = tuple(dims)  # type: ignore[arg-type]
        return back

    def solve_from_facts(self) -> list[onnx.ValueInfoProto]:
        """Value infos for missing values whose shape the graph's facts determine."""
        solved = self._facts()
        missing = set(self.missing())
        unsolved = missing - solved.keys()
        if unsolved:
            solved.update(self._probe(unsolved))
        out = []
        for name, shape in solved.items():
            elem = self.types.get(name) or (self.declared[name].elem_type if name in self.declared else 0)
            if name in missing and elem and all(0 < d <= _MAX_DIM for d in shape):
                out.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return out

    # -- the result ----------------------------------------------------------------------------

    def result(self) -> ShapedModel:
        graph = self.graph
        # Values fed from value_info whose inferred shape is just that declaration.
        filled = [
            n
            for n in self.declared_fed
            if n in self.computed and n in self.declared and self.declared[n].values == self.computed[n]
        ]
        # Last resort: declared shapes for what is still unknown (inference may have failed).
        for name in self.missing():
            decl = self.declared.get(name)
            if decl and decl.values is not None and all(v is not None for v in decl.values):
                self.computed[name] = tuple(int(v) for v in decl.values)  # type: ignore[arg-type]
                filled.append(name)

        shapes = self.shapes
        for name in self.node_outputs:
            if name in self.folded:
                shapes[name] = tuple(self.folded[name].shape)
            elif name in self.computed:
                shapes[name] = self.computed[name]
        dtypes: dict[str, str] = {}
        for name, decl in self.declared.items():
            if decl.elem_type and (dname := _dtype_name(decl.elem_type)) is not None:
                dtypes[name] = dname
        for name, t in self.types.items():
            if (dname := _dtype_name(t)) is not None:
                dtypes[name] = dname
        for name, value in self.constants.items():
            dtypes[name] = value.dtype.name

        empties = _check_positive(graph, self.order, shapes, dtypes, self.constants)
        warn = self.warn
        if filled:
            warn.append(
                f"shapes of {len(filled)} values were taken from the model's declared value_info "
                f"because they could not be computed (e.g. {_limited(filled)})"
            )
        if self.facts_fed:
            warn.append(
                f"shapes of {len(self.facts_fed)} values were derived from the graph's structure because "
                f"their shape constants are absent (e.g. {_limited(self.facts_fed)})"
            )
        _contradictions(self.declared, shapes, set(filled), warn)
        warn.extend(_reshape_mismatches(graph, self.order, shapes, set(filled)))
        warn.extend(_broadcast_mismatches(graph, self.order, shapes))
        unknown = [o for o in self.node_outputs if o not in shapes]
        if unknown:
            ops = sorted({graph.node[self.producer[o]].op_type for o in unknown})
            warn.append(
                f"could not compute the shapes of {len(unknown)} values ({_limited(unknown)}; "
                f"from {_limited(ops)} nodes); they are left out"
            )
        bound = dict(self.bindings)
        bound.update(self.derived)
        return ShapedModel(
            model=_without_empties(self.model, empties, shapes),
            shapes=shapes,
            dtypes=dtypes,
            constants=self.constants,
            dim_bindings=bound,
            warnings=tuple(dict.fromkeys(printable(w) for w in warn)),
        )


def _declared_vis(
    declared: Mapping[str, _Decl], names: Iterable[str], types: Mapping[str, int]
) -> list[onnx.ValueInfoProto]:
    """Concrete declared value infos for ``names`` (those whose every dim evaluates)."""
    out = []
    for name in names:
        decl = declared.get(name)
        if decl is None or decl.values is None:
            continue
        if any(v is None or not 0 <= v <= _MAX_DIM for v in decl.values):
            continue
        elem = decl.elem_type or types.get(name, 0)
        if elem:
            out.append(helper.make_tensor_value_info(name, elem, list(decl.values)))
    return out


def _check_positive(
    graph: onnx.GraphProto,
    order: Sequence[int],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
    constants: Mapping[str, np.ndarray],
) -> set[str]:
    """ModelError for a runtime activation with a negative dim, or a zero dim that reaches the output.

    Integer and bool values are exempt: empty index/shape vectors are normal in shape subgraphs.
    An empty activation that only feeds Concats (directly or through ops whose outputs are empty
    too) is legal and harmless: ONNX's Concat accepts empty operands ("all input tensors must have
    the same shape, except for the dimension size of the axis to concatenate on", onnx/docs/
    Operators.md#Concat), which is how a full-width rotary's pass-through half ``q[..., rot:]``
    (Phi-3, partial_rotary_factor 1.0) is exported. Returns those empty activations.
    """
    absorbed = _absorbed_empties(graph, order, shapes)
    empties: set[str] = set()
    for i in order:
        node = graph.node[i]
        for name in node.output:
            shape = shapes.get(name) if name else None
            if shape is None or name in constants or dtypes.get(name, "float32") in _INT_NAMES:
                continue
            if any(d < 0 for d in shape) or (0 in shape and name not in absorbed):
                raise ModelError(
                    f"value '{name}' ({node.op_type} node '{node.name}') has computed shape "
                    f"{list(shape)} with a zero or negative dim; pass larger --dim values or "
                    "re-export the model"
                )
            if 0 in shape:
                empties.add(name)
    return empties


RESHAPE_MISMATCH = "element counts differ"
"""Marks :func:`_reshape_mismatches`' warnings (``importers.import_model`` cites the first one in a later error)."""


def _reshape_mismatches(
    graph: onnx.GraphProto, order: Sequence[int], shapes: Mapping[str, tuple[int, ...]], skip: set[str]
) -> list[str]:
    """Warnings for Reshapes whose computed output holds a different number of elements than their
    input (ONNX Reshape: "the number of elements of the output must equal that of the input",
    onnx/docs/Operators.md#Reshape); the first and a count.

    ONNX's inference takes an explicit target shape as given, so such a file fails only later, at
    a MatMul that no longer fits; the warning names the Reshape that is the cause. It is not an
    error by itself: a TorchScript file whose traced sizes are baked into a target (``[32, 16,
    64]`` of nn.MultiheadAttention at other dims) still imports. One real source: the TorchScript
    exporter (torch 2.13) rewrites the ``-1`` constant that ``repeat_interleave(x, n, dim=-1)``
    shares with a later ``view(..., -1, head_dim)`` into the normalised dim, so Cohere's q/k/v
    views read ``[b, s, 2, 16]``. Shapes taken from declared ``value_info`` (``skip``) are not
    checked: they are a fallback, not a computation.
    """
    found: list[str] = []
    for i in order:
        node = graph.node[i]
        if node.op_type != "Reshape" or node.domain not in _DEFAULT_DOMAINS or not node.input or not node.output:
            continue
        src, dst = shapes.get(node.input[0]), shapes.get(node.output[0])
        if node.output[0] in skip or src is None or dst is None or math.prod(src) == math.prod(dst):
            continue
        found.append(
            f"Reshape node '{node.name}' turns {list(src)} ({math.prod(src):,} elements) into {list(dst)} "
            f"({math.prod(dst):,} elements): {RESHAPE_MISMATCH}"
        )
    more = f" ({len(found) - 1} more Reshapes too)" if len(found) > 1 else ""
    return [f"{found[0]}{more}; the file's shapes are inconsistent at these dims"] if found else []


def _without_empties(
    model: onnx.ModelProto, empties: set[str], shapes: dict[str, tuple[int, ...]]
) -> onnx.ModelProto:
    """A copy of ``model`` without the nodes that only make the empty values ``empties``, and
    without those values among Concat inputs (a Concat left with one input becomes an Identity).

    Equivalent under ONNX semantics (an empty Concat operand contributes no element), and it keeps
    zero-size ops, which carry no data, out of the op graph and its cost model. ``model`` itself is
    not changed; with no empties it is returned as is. ``shapes`` loses the dropped values.
    """
    if not empties:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for node in out.graph.node:
        outs = [o for o in node.output if o]
        if outs and all(o in empties for o in outs):
            continue
        if node.op_type == "Concat" and node.domain in _DEFAULT_DOMAINS and empties & set(node.input):
            inputs = [name for name in node.input if name not in empties]
            del node.input[:]
            node.input.extend(inputs)
            if len(inputs) == 1:
                node.op_type = "Identity"
                del node.attribute[:]
        kept.append(node)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    for name in empties:
        shapes.pop(name, None)
    return out


def _absorbed_empties(
    graph: onnx.GraphProto, order: Sequence[int], shapes: Mapping[str, tuple[int, ...]]
) -> set[str]:
    """Empty values (a 0 dim, none negative) whose every path ends in a Concat with a non-empty output.

    Walked in reverse topological order, so a value's consumers are decided before it.
    """
    consumers: dict[str, list[int]] = {}
    for i in order:
        for name in graph.node[i].input:
            if name:
                consumers.setdefault(name, []).append(i)
    graph_outputs = {vi.name for vi in graph.output}

    def empty(name: str) -> bool:
        shape = shapes.get(name)
        return shape is not None and 0 in shape and all(d >= 0 for d in shape)

    absorbed: set[str] = set()
    for i in reversed(order):
        for name in graph.node[i].output:
            users = consumers.get(name, [])
            if not name or not empty(name) or name in graph_outputs or not users:
                continue
            if all(_absorbs(graph.node[j], shapes, absorbed) for j in users):
                absorbed.add(name)
    return absorbed


def _absorbs(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]], absorbed: set[str]) -> bool:
    """Whether ``node`` makes an empty input vanish: a Concat with a non-empty output, or a node
    whose every output is itself an absorbed empty value."""
    outs = [o for o in node.output if o]
    if node.op_type == "Concat" and node.domain in _DEFAULT_DOMAINS:
        shape = shapes.get(outs[0]) if outs else None
        return shape is not None and 0 not in shape
    return bool(outs) and all(o in absorbed for o in outs)


_INT_NAMES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "string"}
)


_BROADCASTING_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Where", "Equal",
                                "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "PRelu"})
"""ONNX ops whose inputs broadcast multidirectionally (onnx/docs/Broadcasting.md: each axis, aligned from the
right, equal or 1)."""


def _broadcast_mismatches(
    graph: onnx.GraphProto, order: Sequence[int], shapes: Mapping[str, tuple[int, ...]]
) -> list[str]:
    """A warning naming the first broadcasting node whose inputs' computed shapes do not broadcast (its output,
    and all that follows, is left out), and a count. One real source: the TorchScript exporter (torch 2.13)
    writes ``x.unfold(-2, size, step)`` of a 3-D ``x`` as per-window slices unsqueezed and concatenated at
    axis -2 of the 4-D windows, so PatchTST's patches come out ``[b, channels, patches, size]`` where torch
    has ``[b, patches, channels, size]``, and the position table ``[patches, d]`` meets ``[b, patches,
    channels, d]`` after the model's transpose."""
    found: list[str] = []
    for i in order:
        node = graph.node[i]
        if node.op_type not in _BROADCASTING_OPS or node.domain not in _DEFAULT_DOMAINS or not node.output \
                or node.output[0] in shapes:
            continue
        read = [shapes.get(name) for name in node.input if name]
        if len(read) < 2 or any(shape is None for shape in read):
            continue
        try:
            np.broadcast_shapes(*read)
        except ValueError:
            found.append(f"{node.op_type} node '{node.name}' reads {' and '.join(str(list(s)) for s in read)}, "
                         "which do not broadcast (each axis, aligned from the right, equal or 1)")
    more = f" ({len(found) - 1} more nodes too)" if len(found) > 1 else ""
    return [f"{found[0]}{more}; the file's shapes are inconsistent at these dims"] if found else []


def _contradictions(
    declared: Mapping[str, _Decl],
    shapes: Mapping[str, tuple[int, ...]],
    skip: set[str],
    warn: list[str],
) -> None:
    """Warn where a declared shape disagrees with the computed one (the computed one is kept)."""
    found: list[str] = []
    for name, decl in declared.items():
        if decl.values is None or name in skip or name not in shapes:
            continue
        shape = shapes[name]
        if len(decl.values) != len(shape) or any(
            v is not None and v != s for v, s in zip(decl.values, shape)
        ):
            found.append(f"'{name}' declared [{', '.join(decl.texts)}], computed {list(shape)}")
    if found:
        warn.append(f"{len(found)} declared shape(s) contradict the computed ones, which are used: {_limited(found)}")


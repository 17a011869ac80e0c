r"""One reading of a model file's ONNX nodes, shared by the readers that look past the op graph.

The coarse op graph drops constants and fuses nodes, so seven readers go back to the file's nodes:
norm epsilons (:mod:`importers.norm_eps`), MoE routers' scaling (:mod:`importers.moe_router`), rotary
frequencies (:mod:`importers.rotary`), sliding windows (:mod:`importers.sliding_window`), zero-centred
norm scales (:mod:`importers.zero_centred`), attention scales (:mod:`importers.attention_scale`) and GELU
nodes' forms (:mod:`importers.gelu_form`).
Each used to parse the file itself (:func:`importers.onnx_load.load_onnx`, or ``onnx.load``) and build
its own map of one-element constants; now they share one :class:`OnnxFacts` per file:

* :func:`remember` hands it the model :func:`importers.import_model` already loaded, so a plan parses
  its file once (the import's own parse);
* :func:`file_facts` returns it by path (keyed by the file's SHA-256 when the caller has it, else by
  its size and modification time, so a file rewritten in place is read again), loading the file with
  :func:`~importers.onnx_load.load_onnx` only when nothing was remembered.

The tables (:attr:`OnnxFacts.nodes`, :attr:`~OnnxFacts.producer`, :attr:`~OnnxFacts.scalars`,
:attr:`~OnnxFacts.initializer_sizes`) are built on first use, once per file. Only :data:`CACHED_FILES`
files are kept: a fact holds its model (graph only, no external weights) alive.
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple, TypeVar

import onnx
from onnx import TensorProto, numpy_helper

__all__ = [
    "CACHED_FILES", "FLOAT_TYPES", "NUMBER_TYPES", "OnnxFacts", "Scalar", "facts_of_model", "file_facts",
    "float_values", "forget", "per_reading", "remember",
]

CACHED_FILES = 4
"""Files whose facts are kept (least recently used dropped first): a plan reads one file."""

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
"""The ONNX float element types a norm's epsilon or a rotary frequency is written in."""

NUMBER_TYPES = FLOAT_TYPES | {
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
    TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
}
"""The ONNX float and integer element types (a scale factor may be written in either)."""

_NUMERIC_TYPES = NUMBER_TYPES | {TensorProto.BOOL}


class Scalar(NamedTuple):
    """A one-element constant of the file: an initializer, or a ``Constant`` node's ``value`` /
    ``value_float``."""

    value: float | None
    """Its value; ``None`` when its data is not in the file (external, the data file absent)."""
    data_type: int
    """Its ONNX element type (``TensorProto.FLOAT``...)."""


@dataclass(frozen=True, kw_only=True, eq=False)  # not slotted: cached_property keeps its tables in __dict__
class OnnxFacts:
    """A file's graph as :func:`~importers.onnx_load.load_onnx` reads it, and the tables the readers
    share (module docstring), each built on first use."""

    model: onnx.ModelProto
    """The loaded model (graph only; small integer constants whose data file is there inlined)."""
    sha256: str = ""
    """SHA-256 of the file's bytes, as 64 hex digits ("": not known)."""
    stamp: tuple[int, int] = (0, 0)
    """``(size in bytes, modification time in ns)`` of the file when it was read."""

    @cached_property
    def nodes(self) -> tuple[onnx.NodeProto, ...]:
        """The graph's nodes, in file order."""
        return tuple(self.model.graph.node)

    @cached_property
    def initializers(self) -> tuple[onnx.TensorProto, ...]:
        """The graph's initializers (external ones without their data)."""
        return tuple(self.model.graph.initializer)

    @cached_property
    def producer(self) -> dict[str, onnx.NodeProto]:
        """Value name -> the node that writes it."""
        return {out: node for node in self.nodes for out in node.output}

    @cached_property
    def readers(self) -> dict[str, list[onnx.NodeProto]]:
        """Value name -> the nodes that read it, in file order."""
        found: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                found.setdefault(name, []).append(node)
        return found

    @cached_property
    def initializer_sizes(self) -> dict[str, int]:
        """Initializer name -> its element count."""
        return {t.name: math.prod(t.dims) for t in self.initializers}

    @cached_property
    def scalars(self) -> dict[str, Scalar]:
        """Value name -> :class:`Scalar` of every one-element numeric constant (initializers first,
        then ``Constant`` nodes; a string or complex one is left out)."""
        found: dict[str, Scalar] = {}
        for tensor in self.initializers:
            if math.prod(tensor.dims) == 1 and tensor.data_type in _NUMERIC_TYPES:
                found[tensor.name] = _scalar(tensor)
        for node in self.nodes:
            if node.op_type != "Constant" or not node.output:
                continue
            for attribute in node.attribute:
                tensor = attribute.t
                if attribute.name == "value" and math.prod(tensor.dims) == 1 and tensor.data_type in _NUMERIC_TYPES:
                    found[node.output[0]] = _scalar(tensor)
                elif attribute.name == "value_float":
                    found[node.output[0]] = Scalar(float(attribute.f), TensorProto.FLOAT)
        return found


def _scalar(tensor: onnx.TensorProto) -> Scalar:
    """:class:`Scalar` of a one-element numeric tensor."""
    if tensor.data_location == TensorProto.EXTERNAL or tensor.external_data:
        return Scalar(None, tensor.data_type)
    return Scalar(float(numpy_helper.to_array(tensor).reshape(-1)[0]), tensor.data_type)


_FACTS: OrderedDict[str, OnnxFacts] = OrderedDict()


def _stamp(path: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path``; ``(0, 0)`` when it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return (0, 0)
    return (status.st_size, status.st_mtime_ns)


def _keep(key: str, facts: OnnxFacts) -> OnnxFacts:
    """Store ``facts`` under ``key``, dropping the least recently used beyond :data:`CACHED_FILES`."""
    _FACTS[key] = facts
    _FACTS.move_to_end(key)
    while len(_FACTS) > CACHED_FILES:
        _FACTS.popitem(last=False)
    return facts


def remember(path: str | Path, sha256: str, model: onnx.ModelProto) -> None:
    """Keep ``model``, just loaded from ``path`` by :func:`~importers.onnx_load.load_onnx` (whose hash of
    the file is ``sha256``), as the file's facts; a caller that then changes it calls :func:`forget`."""
    key = str(path)
    _keep(key, OnnxFacts(model=model, sha256=sha256, stamp=_stamp(key)))


def forget(path: str | Path) -> None:
    """Drop the facts of ``path`` (its remembered model was changed: the next reader loads the file)."""
    _FACTS.pop(str(path), None)


def facts_of_model(model: onnx.ModelProto) -> OnnxFacts:
    """The facts of ``model``: the remembered ones when it is a remembered model (the same object),
    else new ones, not kept (a model changed from the file's, such as the importer's shaped copy)."""
    return next((f for f in _FACTS.values() if f.model is model), None) or OnnxFacts(model=model)


def file_facts(path: str | Path, sha256: str = "") -> OnnxFacts:
    """The facts of the ONNX file at ``path`` (module docstring); ``sha256`` (the op graph's hash of
    the file, ``OpGraph.source_sha256``) says which version of it, "" any version whose size and
    modification time are those remembered.

    Raises
    ------
    ModelError
        The file cannot be read as an ONNX model (:func:`~importers.onnx_load.load_onnx`).

    Examples
    --------
    >>> import tempfile
    >>> from onnx import TensorProto as T, helper
    >>> two = helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", T.FLOAT, [], [2.0]))
    >>> node = helper.make_node("Mul", ["x", "two"], ["y"], name="double")
    >>> io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
    >>> model = helper.make_model(helper.make_graph([two, node], "g", io[:1], io[1:]),
    ...                           opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     facts = file_facts(d + "/m.onnx")
    ...     again = file_facts(d + "/m.onnx", facts.sha256)
    >>> facts.scalars, facts.producer["y"].name, again is facts
    ({'two': Scalar(value=2.0, data_type=1)}, 'double', True)
    """
    from importers.onnx_load import load_onnx

    key = str(path)
    facts = _FACTS.get(key)
    if facts is not None and (facts.sha256 == sha256 if sha256 and facts.sha256 else facts.stamp == _stamp(key)):
        _FACTS.move_to_end(key)
        return facts
    stamp = _stamp(key)
    model, digest = load_onnx(Path(path))
    return _keep(key, OnnxFacts(model=model, sha256=digest, stamp=stamp))


_Answer = TypeVar("_Answer")


def per_reading(read: Callable[[OnnxFacts], _Answer]) -> Callable[..., _Answer]:
    """``read`` as a function of ``(path, sha256="")`` whose answer is kept per reading of the file
    (:func:`file_facts`: its SHA-256 when the caller has it, else its size and modification time), so a
    file rewritten in place is read again, and dropped with that reading. The readers' callers ask on
    every stage of a search; each reads the file's nodes once.

    >>> calls = []
    >>> node_count = per_reading(lambda facts: calls.append(1) or len(facts.nodes))
    >>> import tempfile
    >>> from onnx import TensorProto as T, helper
    >>> io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
    >>> model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", io[:1], io[1:]))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     first, again = node_count(d + "/m.onnx"), node_count(d + "/m.onnx")
    ...     _ = model.graph.node.add().CopyFrom(helper.make_node("Relu", ["y"], ["z"]))
    ...     onnx.save(model, d + "/m.onnx"); os.utime(d + "/m.onnx", ns=(1, 1))  # another size and time
    ...     rewritten = node_count(d + "/m.onnx")
    >>> first, again, rewritten, len(calls)
    (1, 1, 2, 2)
    """
    answers: weakref.WeakKeyDictionary[OnnxFacts, _Answer] = weakref.WeakKeyDictionary()

    @functools.wraps(read)
    def of_file(path: str | Path, sha256: str = "") -> _Answer:
        facts = file_facts(path, sha256)
        if facts not in answers:
            answers[facts] = read(facts)
        return answers[facts]

    return of_file


def float_values(facts: OnnxFacts, *, types: frozenset[int] = FLOAT_TYPES) -> dict[str, float]:
    """Value name -> value of the one-element constants of ``types`` whose data the file holds."""
    return {name: s.value for name, s in facts.scalars.items() if s.value is not None and s.data_type in types}


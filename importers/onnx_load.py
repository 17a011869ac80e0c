"""Read an ONNX file's graph without its weights, and reject what the importer cannot handle.

:func:`load_onnx` reads the file once, hashing its bytes as they are read (the hash keys caches and
plans), parses the protobuf without touching external data (as ``onnx.load(path,
load_external_data=False)`` does), and checks, cheaply and before any other stage runs:

* the file exists, is a regular file (a FIFO or device is refused before it is read) of at most
  2 GiB, is readable, parses as a ``ModelProto`` (a truncated or foreign file
  fails here, or in the reference check below when protobuf happened to stop at a field boundary);
* the onnx library understands its IR version and default-domain opset; an opset older than 13
  (attribute forms of Split/Squeeze/Unsqueeze/Reduce* that the rules do not model) is converted by
  :func:`importers.legacy.modernize` with onnx's version converter, which also recognises the
  stand-in weights and the fixed batch of 1 of model-zoo files (noted in ``notes``);
* the graph has nodes, and every node input is produced by something (graph input, initializer or an
  earlier node output), so a half-written file is not mistaken for a small model;
* there is no control flow (``If``/``Loop``/``Scan``, or any node carrying a subgraph): the op graph
  is a static DAG, so such models must be exported traced / unrolled. An ``If`` whose condition reads
  only shapes (TorchScript's squeeze of an axis of unknown size) is kept: the importer decides it once
  the dims are bound (:mod:`importers.shape_if`); one whose condition reads tensor values is refused,
  saying so. The one loop both torch
  exporters write for ``nn.EmbeddingBag`` is first rewritten into one embedding-bag node
  (:func:`importers.embedding_bag.recognise_embedding_bags`).

Weights are never read. The one exception is :func:`read_small_external_int`: small integer tensors
stored externally (Reshape targets, Slice bounds) are what shape inference needs, so when the data
file is present :func:`load_onnx` inlines those (at most ``SMALL_INT_MAX_BYTES`` each) into the
returned proto; float weights stay where they are.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from importers.embedding_bag import recognise_embedding_bags
from importers.legacy import MIN_OPSET, modernize
from planner.core.errors import ModelError

__all__ = [
    "load_onnx",
    "condition_data_read",
    "SHAPE_ONLY_OPS",
    "read_small_external_int",
    "printable",
    "MIN_OPSET",
    "SMALL_INT_MAX_BYTES",
    "MAX_MODEL_BYTES",
]

MAX_MODEL_BYTES = 2**31 - 1
"""Largest ``.onnx`` file read (bytes): protobuf cannot parse a message over 2 GiB, so a bigger file
is refused before it is read (larger models keep their weights as external data)."""

SMALL_INT_MAX_BYTES = 4096
"""Largest external integer tensor (bytes) that :func:`load_onnx` reads back for shape inference."""

_READ_CHUNK_BYTES = 1 << 22
_CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})
"""Ops whose output depends only on the shape of their input, never on its values."""
_RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
_INT_TYPES = frozenset(
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
_GRAPH_ATTR_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def load_onnx(path: str | Path, notes: list[str] | None = None) -> tuple[onnx.ModelProto, str]:
    """Load an ONNX model's graph (no weight data) and the SHA-256 of the file.

    Parameters
    ----------
    path:
        The ``.onnx`` file. Its external-data file (if any) may be present or absent.
    notes:
        When given, lines saying what :func:`importers.legacy.modernize` changed (an old opset
        converted, a fixed batch made rebindable...) are appended to it.

    Returns
    -------
    model:
        The parsed model. External initializers keep their name, dtype and dims but no data, except
        small integer ones whose data file exists (see :func:`read_small_external_int`), which are
        inlined.
    sha256_hex:
        SHA-256 of the ``.onnx`` file's bytes (not of the external data), as 64 hex digits.

    Raises
    ------
    ModelError
        One line ending with the fix: missing or unreadable file, a directory, not ONNX or truncated,
        IR/opset newer than the installed onnx, opset older than 13, empty graph, control flow, or a
        node reading a value that nothing produces.

    Examples
    --------
    >>> import tempfile, onnx
    >>> from onnx import helper, TensorProto
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    >>> graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    >>> m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(m, d + "/m.onnx")
    ...     model, digest = load_onnx(d + "/m.onnx")
    >>> [n.op_type for n in model.graph.node], len(digest)
    (['Relu'], 64)
    """
    path = Path(path)
    try:
        data, digest = _read_hashed(path)
        try:
            model = onnx.load_model_from_string(data)
        except Exception as exc:  # protobuf's DecodeError, or anything the parser raises on garbage
            raise ModelError(
                f"'{path}' is not a readable ONNX model ({_one_line(exc)}); the file may be "
                "truncated or not ONNX: re-export it"
            ) from None
        _check_model(model, path)
        recognise_embedding_bags(model)
        _check_graph(model, path)
        _normalise_transpose_perms(model)
        model, changes = modernize(model, f"'{path.name}'")
        if notes is not None:
            notes.extend(printable(line) for line in changes)
    except ModelError as exc:
        # Names in a corrupt file may hold newlines or control characters: keep messages one line.
        exc.args = (printable(str(exc)),)
        raise
    _inline_small_external_ints(model, path.parent)
    return model, digest


def read_small_external_int(
    model: onnx.ModelProto,
    tensor: onnx.TensorProto | str,
    base_dir: str | Path,
    max_bytes: int = SMALL_INT_MAX_BYTES,
) -> np.ndarray | None:
    """Read one small integer tensor stored as external data, if its data file is there.

    Parameters
    ----------
    model:
        The model the tensor belongs to; used to look the tensor up when ``tensor`` is a name.
    tensor:
        An initializer (or Constant-node tensor) with ``data_location == EXTERNAL``, or an
        initializer's name.
    base_dir:
        Folder of the ``.onnx`` file; external locations are relative to it.
    max_bytes:
        Largest tensor to read, in bytes.

    Returns
    -------
    numpy.ndarray or None
        The values with the tensor's dims and integer (or bool) dtype; ``None`` if the tensor is not
        external, not an integer type, larger than ``max_bytes``, its location escapes ``base_dir``,
        or the data file is missing or too short.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> t = onnx.TensorProto(name="shape", data_type=TensorProto.INT64, dims=[2])
    >>> t.data_location = TensorProto.EXTERNAL
    >>> for key, value in {"location": "w.bin", "offset": "8", "length": "16"}.items():
    ...     entry = t.external_data.add(); entry.key, entry.value = key, value
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = pathlib.Path(d, "w.bin").write_bytes(np.array([0, 3, 4], "<i8").tobytes())
    ...     read_small_external_int(onnx.ModelProto(), t, d).tolist()
    [3, 4]
    """
    if isinstance(tensor, str):
        found = [t for t in model.graph.initializer if t.name == tensor]
        if not found:
            return None
        tensor = found[0]
    if tensor.data_location != TensorProto.EXTERNAL or tensor.data_type not in _INT_TYPES:
        return None
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        return None
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    nbytes = math.prod(dims) * dtype.itemsize
    if nbytes > max_bytes:
        return None
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else nbytes
    except ValueError:
        return None
    if not location or offset < 0 or length != nbytes:
        return None
    base = Path(base_dir).resolve()
    file = (base / location).resolve()
    # An ONNX file must not make us read outside its folder (onnx's own loader refuses it too).
    if not file.is_relative_to(base) or not file.is_file():
        return None
    try:
        with open(file, "rb") as handle:
            handle.seek(offset)
            raw = handle.read(nbytes)
    except OSError:
        return None
    if len(raw) != nbytes:
        return None
    # External data is little-endian by the ONNX spec.
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(dims)


def _read_hashed(path: Path) -> tuple[bytes, str]:
    """The file's bytes and their SHA-256, read once; ModelError for unusable paths.

    Only a regular file is read, and at most ``MAX_MODEL_BYTES`` of it: a FIFO would block
    forever and ``/dev/zero`` never ends. The file is opened non-blocking and checked on the open
    descriptor (``fstat``), so it cannot be swapped for a FIFO between a check and the read.
    """
    if not path.exists():
        raise ModelError(f"ONNX file '{path}' does not exist; check the path")
    if path.is_dir():
        raise ModelError(f"'{path}' is a directory; pass the .onnx file inside it")
    hasher = hashlib.sha256()
    chunks: list[bytes] = []
    total = 0
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ModelError(
            f"cannot read '{path}' ({_one_line(exc.strerror or exc)}); check its permissions"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelError(
                f"'{path}' is a {_file_kind(info.st_mode)}, not a regular file; pass the .onnx file "
                "itself (save a stream to a file first)"
            )
        if info.st_size > MAX_MODEL_BYTES:
            raise ModelError(_too_big(path, info.st_size))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            while chunk := handle.read(_READ_CHUNK_BYTES):
                total += len(chunk)
                if total > MAX_MODEL_BYTES:  # the file grew while being read
                    raise ModelError(_too_big(path, total))
                hasher.update(chunk)
                chunks.append(chunk)
    except OSError as exc:
        raise ModelError(
            f"cannot read '{path}' ({_one_line(exc.strerror or exc)}); check its permissions"
        ) from None
    finally:
        os.close(fd)
    return b"".join(chunks), hasher.hexdigest()


def _too_big(path: Path, size_bytes: int) -> str:
    return (
        f"'{path}' is {size_bytes / 2**30:.1f} GiB, more than a protobuf message can hold (2 GiB); "
        "save the weights as external data (onnx.save_model(model, path, save_as_external_data=True)) "
        "or pass the graph-only file"
    )


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _check_model(model: onnx.ModelProto, path: Path) -> None:
    """Raise ModelError for models the importer cannot handle (see module docstring)."""
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(
            f"'{path}' is not an ONNX model (no IR version or graph); pass an .onnx file exported "
            "by torch.onnx.export or another ONNX exporter"
        )
    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"'{path}' has ONNX IR version {model.ir_version}, newer than this onnx library reads "
            f"({onnx.IR_VERSION}); upgrade onnx (pip install -U onnx) or re-export with an older IR"
        )
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not opsets:
        raise ModelError(
            f"'{path}' declares no default ONNX opset; the file is not a valid ONNX model: re-export "
            f"with opset >= {MIN_OPSET}"
        )
    opset = max(opsets)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelError(
            f"'{path}' uses opset {opset}, newer than this onnx library knows ({newest}); upgrade "
            "onnx (pip install -U onnx) or re-export with an older opset"
        )
    graph = model.graph
    if not _all_text(model):
        raise ModelError(
            f"'{path}' has names that are not valid UTF-8 text; the file is corrupt: re-export it"
        )
    if len(graph.node) == 0:
        raise ModelError(
            f"'{path}' has an empty graph (no nodes); re-export the model with its computation"
        )


def _check_graph(model: onnx.ModelProto, path: Path) -> None:
    """Raise ModelError for control flow, or a node reading a value nothing produces."""
    graph = model.graph
    main = len(graph.node)
    for index, node in enumerate(_all_nodes(model)):
        if node.op_type in _CONTROL_FLOW_OPS or any(
            a.type in _GRAPH_ATTR_TYPES for a in node.attribute
        ):
            _check_control_flow(graph, node, path, in_main_graph=index < main)
    known = {v.name for v in graph.input}
    known.update(t.name for t in graph.initializer)
    known.update(t.values.name for t in graph.sparse_initializer)
    known.add("")
    for node in graph.node:
        for name in node.input:
            if name not in known:
                raise ModelError(
                    f"'{path}': node '{node.name}' ({node.op_type}) reads '{name}', which no input, "
                    "initializer or earlier node produces; the file is truncated or corrupt: "
                    "re-export it"
                )
        known.update(node.output)


def _check_control_flow(graph: onnx.GraphProto, node: onnx.NodeProto, path: Path, *, in_main_graph: bool) -> None:
    """ModelError for a control-flow node, except an If of the main graph whose condition reads only
    shapes and whose branches hold no control flow (:mod:`importers.shape_if` decides it at the dims)."""
    branches = [a.g for a in node.attribute if a.name in ("then_branch", "else_branch") and a.type == onnx.AttributeProto.GRAPH]
    shape_if = (node.op_type == "If" and node.domain in ("", "ai.onnx") and in_main_graph and len(node.input) == 1
                and node.input[0] != "" and len(branches) == 2 and len(node.attribute) == 2
                and all(len(b.output) == len(node.output) for b in branches))
    read = condition_data_read(graph, node) if shape_if else None
    nested = [n for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for n in a.g.node
              if n.op_type in _CONTROL_FLOW_OPS or any(b.type in _GRAPH_ATTR_TYPES for b in n.attribute)]
    if shape_if and read is None and not nested:
        return
    what = f"{node.op_type} node '{node.name}'"
    if read is not None:
        what = f"If node '{node.name}', whose condition reads tensor values, not shapes: '{read}'"
    elif nested:
        what = f"{nested[0].op_type} node '{nested[0].name}' inside If node '{node.name}'"
    raise ModelError(
        f"'{path}' contains control flow ({what}), which is not supported; export with the control "
        "flow unrolled / traced (e.g. torch.onnx.export of a traced model with fixed loop counts)"
    )


def condition_data_read(graph: onnx.GraphProto, node: onnx.NodeProto) -> str | None:
    """The first value whose data an If's condition reads, or ``None`` when it reads only shapes and constants.

    Parameters
    ----------
    graph:
        The graph holding ``node`` (its inputs, initializers and nodes are looked up by name).
    node:
        An ``If`` node of ``graph``.

    Returns
    -------
    str or None
        A graph input, an output of a random op or of another control-flow node that the condition
        depends on through something other than ``Shape`` / ``Size``; ``None`` when every path from the
        condition ends at a ``Shape`` / ``Size``, a ``Constant`` or an initializer.

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ReduceMax", ["x"], ["m"])]
    >>> x = helper.make_tensor_value_info("x", T.FLOAT, ["n"])
    >>> g = helper.make_graph(nodes, "g", [x], [])
    >>> condition_data_read(g, helper.make_node("If", ["s"], ["y"])) is None
    True
    >>> condition_data_read(g, helper.make_node("If", ["m"], ["y"]))
    'x'
    """
    producer = {out: n for n in graph.node for out in n.output if out}
    initializers = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = {vi.name for vi in graph.input} - initializers
    stack = [name for name in node.input[:1] if name]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name in initializers:
            continue
        seen.add(name)
        if name in inputs:
            return name
        source = producer.get(name)
        if source is None:  # read but never produced: the loader's reference check names it
            continue
        if source.domain in ("", "ai.onnx") and source.op_type in SHAPE_ONLY_OPS | {"Constant"}:
            continue
        if source.op_type in _RANDOM_OPS | _CONTROL_FLOW_OPS:
            return name
        stack.extend(i for i in source.input if i)
    return None


def _normalise_transpose_perms(model: onnx.ModelProto) -> None:
    """Negative ``perm`` entries of Transpose nodes made positive (in place).

    The TorchScript exporter copies ``x.permute(0, -2, -1, 1)`` (transformers' Mamba-2 chunked scan)
    into ``perm`` as written, which the ONNX spec does not allow (its shape inference stops there and
    everything after the Transpose loses its shape). ``perm`` is a permutation of ``range(len(perm))``,
    so ``p + len(perm)`` is the axis torch meant.
    """
    for node in model.graph.node:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        for attr in node.attribute:
            if attr.name == "perm" and any(p < 0 for p in attr.ints):
                rank = len(attr.ints)
                fixed = [p + rank if -rank <= p < 0 else p for p in attr.ints]
                del attr.ints[:]
                attr.ints.extend(fixed)


def _all_text(model: onnx.ModelProto) -> bool:
    """Whether every name the importer reads decoded as text.

    ONNX's protos are proto2, whose string fields are not checked for UTF-8 when parsed: a corrupt
    byte comes back as ``bytes`` instead of ``str`` and would break every later stage.
    """
    graph = model.graph
    texts: list[object] = [o.domain for o in model.opset_import]
    texts.append(graph.name)
    for node in graph.node:
        texts.extend((node.op_type, node.domain, node.name))
        texts.extend(a.name for a in node.attribute)
        texts.extend(node.input)
        texts.extend(node.output)
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        texts.append(vi.name)
        if vi.type.WhichOneof("value") == "tensor_type":
            texts.extend(d.dim_param for d in vi.type.tensor_type.shape.dim)
    texts.extend(t.name for t in graph.initializer)
    for t in graph.initializer:
        texts.extend(e.value for e in t.external_data)
    return all(type(t) is str for t in texts)


def _all_nodes(model: onnx.ModelProto):
    """Nodes of the main graph and of model-local functions."""
    yield from model.graph.node
    for function in model.functions:
        yield from function.node


def _inline_small_external_ints(model: onnx.ModelProto, base_dir: Path) -> None:
    """Inline the data of small external integer tensors whose data file exists (in place)."""
    tensors: list[TensorProto] = list(model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            tensors.extend(a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
    for tensor in tensors:
        if tensor.data_location != TensorProto.EXTERNAL or tensor.data_type not in _INT_TYPES:
            continue
        values = read_small_external_int(model, tensor, base_dir)
        if values is None:
            continue
        tensor.ClearField("external_data")
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


def printable(text: str) -> str:
    """``text`` with newlines and other non-printable characters escaped, so it stays one line.

    Examples
    --------
    >>> print(printable("node 'a" + chr(10) + "b'"))
    node 'a\\nb'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _one_line(exc: object) -> str:
    """First line of an exception's text, shortened, so messages stay one line."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."

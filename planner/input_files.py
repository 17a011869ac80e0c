"""Files the user names on the command line, read safely before the library reads them.

* :func:`check_cluster_nesting`: a YAML cluster file nested more than :data:`MAX_CLUSTER_NESTING`
  deep is refused before PyYAML builds it. PyYAML's pure-Python scanner is quadratic in the
  nesting of flow collections (``"[" * 100_000`` takes minutes, then fails), so the depth is
  counted on the event stream, which stops at the first level too many.
* :func:`saved_plan_paths`: ``-`` (standard input) or a pipe named by a file descriptor
  (``/dev/stdin``, ``/dev/fd/63`` of bash's ``<(...)``) as a saved plan for ``explain``, ``compare``
  and ``export``. The loaders read a plan file more than once (its kind, then the plan), and a pipe
  can be read only once, so it is copied once into a private temporary folder, removed afterwards;
  messages name it as given (``<stdin>`` for ``-``). A model with its plan written in
  (``--export onnx``, a ``.onnx`` file) is read there too: its generic plan is written to the folder
  (:func:`planner.saved_plan.onnx_plan_document`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from planner.core.errors import InputError, PlannerError

__all__ = ["MAX_CLUSTER_NESTING", "MAX_STDIN_PLAN_BYTES", "STDIN_NAME", "check_cluster_nesting", "reads_once",
           "saved_plan_paths"]

MAX_CLUSTER_NESTING = 32
"""Deepest nesting of lists and mappings a YAML cluster file may have (levels). A real one has three
(the file's mapping, ``device:``, ``peak_flops:``)."""

MAX_STDIN_PLAN_BYTES = 256 << 20
"""Most bytes of a plan read from a pipe (256 MiB, the size limit of a plan file); one byte more is
copied, so that the plan reader refuses it as too large."""

STDIN_NAME = "<stdin>"
"""How messages name a plan read from standard input."""


def check_cluster_nesting(path: Path) -> None:
    """Refuse a YAML cluster file nested more than :data:`MAX_CLUSTER_NESTING` levels deep.

    Anything else wrong with the file (missing, not a regular file, over the size limit, not
    UTF-8, bad syntax, a JSON file) is left to :func:`objectives.cluster.load_cluster`, which says
    what it is. The check reads at most :data:`objectives.cluster.MAX_CLUSTER_FILE_BYTES` bytes and
    takes well under a second on any such file.

    Raises
    ------
    InputError
        The file nests lists or mappings more than :data:`MAX_CLUSTER_NESTING` deep.
    """
    text = _small_yaml_text(path)
    if text is None:
        return
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)  # libyaml: linear, and fails fast on deep nesting
    for loader in ([fast] if fast is not None else []) + [yaml.SafeLoader]:
        try:
            depth = _nesting_depth(text, loader)
        except yaml.YAMLError as exc:
            if "nesting depth" not in str(getattr(exc, "problem", "")):
                continue  # libyaml refused it otherwise: count with PyYAML itself, which loads the file
            depth = MAX_CLUSTER_NESTING + 1  # libyaml's own limit (1,000 levels) is far over ours
        except RecursionError:
            depth = MAX_CLUSTER_NESTING + 1
        if depth > MAX_CLUSTER_NESTING:
            raise InputError(
                f"cluster file '{path}' nests lists or mappings more than {MAX_CLUSTER_NESTING} levels deep; "
                "a cluster file is a small mapping such as 'device: h100-sxm' and 'nodes: 2': fix the file"
            )
        return


def _small_yaml_text(path: Path) -> str | None:
    """The text of a YAML cluster file, or ``None`` when the loader itself should report the file
    (a ``.json`` file, a missing, special, oversized, unreadable or non-UTF-8 one)."""
    from objectives.cluster import MAX_CLUSTER_FILE_BYTES

    if path.suffix.lower() == ".json":
        return None  # json.loads refuses deep nesting at once (RecursionError), and load_cluster says so
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CLUSTER_FILE_BYTES:
            return None
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CLUSTER_FILE_BYTES + 1)
        return None if len(raw) > MAX_CLUSTER_FILE_BYTES else raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _nesting_depth(text: str, loader: type) -> int:
    """The deepest nesting of lists and mappings in ``text`` (levels), counted on ``loader``'s event
    stream up to one level over :data:`MAX_CLUSTER_NESTING` (the stream is not read further)."""
    import yaml

    depth = deepest = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_CLUSTER_NESTING:
                break
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
    return deepest


def reads_once(path: Path) -> bool:
    """Whether ``path`` can be read only once: ``-`` (standard input), or a pipe named by its file
    descriptor (``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N``: ``cat plan.json | planner explain
    /dev/stdin``, or bash's ``<(...)``). A file of that name that is not a pipe (``/dev/stdin`` of
    ``< plan.json``) reads like any file, and is left to the loaders. A file named ``-`` is ``./-``."""
    if str(path) == "-":
        return True
    if not _DESCRIPTOR_PATH.fullmatch(str(path)):
        return False
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


_DESCRIPTOR_PATH = re.compile(r"/dev/stdin|/dev/fd/\d+|/proc/self/fd/\d+")


@contextlib.contextmanager
def saved_plan_paths(paths: Sequence[Path], *, command: str) -> Iterator[list[Path]]:
    """``paths`` with each one that can be read only once (:func:`reads_once`) replaced by a private
    copy, for the duration of the ``with`` block.

    Parameters
    ----------
    paths:
        The plan files as given on the command line.
    command:
        The command's name, for messages (``"explain"``).

    Raises
    ------
    InputError
        Two paths name one pipe (``- /dev/stdin``); standard input is a terminal, a device or
        closed; a pipe gives nothing. Errors raised inside the block that name a copy name its
        source instead (``<stdin>`` for ``-``).
    """
    from planner.saved_plan import is_onnx_plan

    readers = [i for i, path in enumerate(paths) if reads_once(path) or is_onnx_plan(path)]
    if not readers:
        yield list(paths)
        return
    sources = [_source_key(paths[i]) for i in readers if reads_once(paths[i])]
    if len(set(sources)) < len(sources):
        raise InputError(f"{command} reads a pipe once; give '-' (or /dev/stdin) for one plan only and a file for the other")
    try:
        folder = Path(tempfile.mkdtemp(prefix="planner-stdin-"))  # mode 0700: nobody else reads or swaps the copy
    except OSError as exc:
        raise InputError(f"cannot copy a piped plan to a temporary folder ({exc.strerror or exc}); "
                         "set TMPDIR to a writable folder, or pass the plan's file") from None
    copies = {i: folder / f"plan-{i}.json" for i in readers}
    try:
        for i, copy in copies.items():
            if is_onnx_plan(paths[i]):  # a model with its plan written in (--export onnx): its generic plan
                _write_onnx_plan(paths[i], copy)
            else:
                _copy_once(paths[i], copy, command=command)
        try:
            yield [copies.get(i, path) for i, path in enumerate(paths)]
        except PlannerError as error:
            for i, copy in copies.items():
                shown = STDIN_NAME if str(paths[i]) == "-" else str(paths[i])
                error.args = tuple(a.replace(str(copy), shown) if isinstance(a, str) else a for a in error.args)
            raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_onnx_plan(model: Path, target: Path) -> None:
    """The generic plan held by ``model`` (``--export onnx``), written to ``target`` as JSON."""
    import json

    from planner.saved_plan import onnx_plan_document

    target.write_text(json.dumps(onnx_plan_document(model)), encoding="utf-8")


def _source_key(path: Path) -> tuple[int, int] | str:
    """What ``path`` reads, so that two names of one pipe are told apart from two pipes."""
    try:
        info = os.fstat(0) if str(path) == "-" else os.stat(path)
    except (OSError, ValueError):
        return str(path)
    return info.st_dev, info.st_ino


def _copy_once(source: Path, target: Path, *, command: str) -> None:
    """Copy ``source`` (``-``: standard input) to ``target``, at most :data:`MAX_STDIN_PLAN_BYTES` + 1
    bytes (the plan reader refuses one byte over its limit)."""
    name = "standard input" if str(source) == "-" else str(source)
    example = f"pipe a plan in, e.g. cat plan.json | planner {command} -"
    try:
        with contextlib.ExitStack() as stack:
            stream = _stdin_stream(command) if str(source) == "-" else stack.enter_context(open(source, "rb"))
            out = stack.enter_context(open(target, "xb"))
            left = MAX_STDIN_PLAN_BYTES + 1
            while left > 0:
                chunk = stream.read(min(left, 1 << 20))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read the plan from {name} ({exc.strerror or exc}); pass the plan's file") from None
    if left == MAX_STDIN_PLAN_BYTES + 1:
        raise InputError(f"{command}: {name} is empty; {example}")


def _stdin_stream(command: str):
    """Standard input as bytes; refused when it is closed, a terminal (nothing piped in) or a device
    (``< /dev/zero`` would never end)."""
    example = f"pipe a plan in, e.g. cat plan.json | planner {command} -"
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None or sys.stdin.closed:
        raise InputError(f"{command} -: standard input is closed; {example}")
    if sys.stdin.isatty():
        raise InputError(f"{command} -: standard input is a terminal; {example}")
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):  # no descriptor (a test's input): a stream of bytes
        return stream
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise InputError(f"{command} -: standard input is a device, not a plan; {example}")
    return stream

"""Reading symbolic-dim bindings (``--dim batch=32``), shared by the CLI, the library and the benches."""

from __future__ import annotations

from planner.core.errors import InputError

__all__ = ["parse_dims", "shown"]


def shown(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message (a 5000-digit value stays one line).

    >>> shown("x" * 100, 10)
    'xxxxxxx...'
    """
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_dims(values: list[str] | None) -> dict[str, int]:
    """Parse ``NAME=VALUE`` bindings (``--dim``) into ``{name: value}``.

    Raises
    ------
    InputError
        A binding without ``=`` or a name, or a value that is not a positive integer.

    Examples
    --------
    >>> parse_dims(["batch=32", "seq=1024"])
    {'batch': 32, 'seq': 1024}
    """
    dims: dict[str, int] = {}
    for text in values or []:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"cannot read --dim '{shown(text)}'; write NAME=VALUE, e.g. --dim batch=32")
        try:
            number = int(value) if len(value) <= 40 else None  # int() refuses 4300+ digits with its own advice
        except ValueError:
            number = None
        if number is None:
            raise InputError(f"--dim {shown(name)} needs an integer value (got '{shown(value)}'), e.g. --dim {shown(name)}=32")
        if number <= 0:
            raise InputError(f"--dim {shown(name)} must be a positive integer (got {number})")
        dims[name] = number
    return dims

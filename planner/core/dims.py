"""Reading symbolic-dim bindings (``--dim batch=32``), shared by the CLI, the library and the benches."""

from __future__ import annotations

from planner.core.errors import InputError

__all__ = ["parse_dims", "shown", "DIM_SUFFIXES"]

DIM_SUFFIXES = {"k": 1 << 10, "m": 1 << 20}
"""Binary multipliers of a ``--dim`` value, as context lengths are named: ``32k`` = 32,768, ``1m`` = 1,048,576
(Llama 3's "128K context" is 131,072 tokens); case does not matter."""


def shown(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message (a 5000-digit value stays one line).

    >>> shown("x" * 100, 10)
    'xxxxxxx...'
    """
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_dims(values: list[str] | None) -> dict[str, int]:
    """Parse ``NAME=VALUE`` bindings (``--dim``) into ``{name: value}``.

    A value may end in ``k`` or ``m`` (:data:`DIM_SUFFIXES`: 1,024 and 1,048,576), the way context lengths are
    named.

    Raises
    ------
    InputError
        A binding without ``=`` or a name, or a value that is not a positive integer.

    Examples
    --------
    >>> parse_dims(["batch=32", "seq=1024"])
    {'batch': 32, 'seq': 1024}
    >>> parse_dims(["seq=32k", "seq_kv=1M"])
    {'seq': 32768, 'seq_kv': 1048576}
    """
    dims: dict[str, int] = {}
    for text in values or []:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"cannot read --dim '{shown(text)}'; write NAME=VALUE, e.g. --dim batch=32")
        number = _dim_value(value.strip())
        if number is None:
            raise InputError(f"--dim {shown(name)} needs an integer value (got '{shown(value)}'), "
                             f"e.g. --dim {shown(name)}=32 (a k or m suffix multiplies by 1,024 or 1,048,576)")
        if number <= 0:
            raise InputError(f"--dim {shown(name)} must be a positive integer (got {number})")
        dims[name] = number
    return dims


def _dim_value(text: str) -> int | None:
    """``text`` as a whole number, with an optional :data:`DIM_SUFFIXES` suffix; ``None`` when it is not one."""
    multiplier = DIM_SUFFIXES.get(text[-1:].lower(), 1)
    digits = text[:-1] if multiplier > 1 else text
    if len(digits) > 40:  # int() refuses 4300+ digits with its own advice
        return None
    try:
        return int(digits) * multiplier
    except ValueError:
        return None

"""Parsing and formatting of sizes and durations; units are converted once, here.

Sizes are bytes (int). ``KB``/``MB``/``GB``/``TB`` are SI (10^3 steps); ``KiB``/``MiB``/``GiB``/``TiB``
are binary (2^10 steps). Durations are seconds (float).
"""

from __future__ import annotations

import math
import re

from planner.core.errors import InputError

__all__ = ["parse_size", "format_bytes", "format_seconds", "DTYPE_BYTES"]

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

#: Bytes per element of ONNX/numpy dtype names.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8e4m3fn": 1,
    "float8e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "string": 8,
}


def parse_size(text: str) -> int:
    """Parse a memory size such as ``"16GB"``, ``"80GiB"`` or ``"512 MB"`` into bytes.

    Parameters
    ----------
    text:
        A positive number with an optional unit: B, KB, MB, GB, TB (powers of 1000) or
        KiB, MiB, GiB, TiB (powers of 1024). Units are case-insensitive.

    Returns
    -------
    int
        The size in bytes.

    Raises
    ------
    InputError
        If the text is not a positive size with a known unit.

    Examples
    --------
    >>> parse_size("16GB")
    16000000000
    >>> parse_size("1.5 GiB")
    1610612736
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise InputError(f"cannot read size '{text}'; write a number and a unit, e.g. 16GB or 80GiB")
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.upper())
    if factor is None:
        known = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
        raise InputError(f"unknown size unit '{unit}' in '{text}'; use one of {known}")
    value = float(number) * factor
    if value <= 0:
        raise InputError(f"size '{text}' must be positive")
    if not math.isfinite(value) or value > 2.0**100:  # 1e400TB is inf: int() of it would crash
        raise InputError(f"size '{text}' is too large; write a real memory size, e.g. 80GB")
    return int(round(value))


def format_bytes(num_bytes: float) -> str:
    """Format a byte count with a binary unit, e.g. ``"12.3 GiB"``.

    Examples
    --------
    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    >>> format_bytes(512)
    '512 B'
    """
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float) -> str:
    """Format a duration with a readable unit.

    Examples
    --------
    >>> format_seconds(0.0123)
    '12.30 ms'
    >>> format_seconds(2.5)
    '2.500 s'
    """
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"

"""The planner's error hierarchy.

Every error a user can cause by their input is a :class:`PlannerError`; the CLI catches it once,
prints its one-line message (which ends with the fix) and exits with code 2. Anything else is an
internal bug and is shown with a traceback only under ``--debug``.
"""

from __future__ import annotations

__all__ = ["PlannerError", "InputError", "ModelError", "UnboundDimError", "UnsupportedExport"]


class PlannerError(Exception):
    """Base class of all errors caused by the user's input or environment."""

    exit_code: int = 2


class InputError(PlannerError):
    """A command-line value, file or setting is invalid; the message says how to fix it."""


class ModelError(InputError):
    """The ONNX model cannot be read or imported (missing, truncated, unsupported construct)."""


class UnboundDimError(ModelError):
    """A symbolic dimension of the model has no value; the message names the ``--dim`` flag to set."""

    def __init__(self, dim_name: str, where: str) -> None:
        self.dim_name = dim_name
        self.where = where
        flag = f"{dim_name}=VALUE"
        if not all(c.isalnum() or c in "_[].-" for c in dim_name):  # spaces, quotes...: quote for the shell
            flag = "'" + flag.replace("'", "'\\''") + "'"
        super().__init__(f"dim '{dim_name}' is unbound ({where}); pass --dim {flag}")


class UnsupportedExport(PlannerError):
    """A target framework cannot express a strategy.

    Attributes
    ----------
    reason:
        Why the target cannot run the strategy.
    nearest:
        The nearest strategy the target can express (or ``None``), with its cost in
        ``nearest_summary``.
    """

    def __init__(self, reason: str, *, nearest: object | None = None, nearest_summary: str = "") -> None:
        self.reason = reason
        self.nearest = nearest
        self.nearest_summary = nearest_summary
        message = reason
        if nearest_summary:
            message += f"; nearest expressible plan: {nearest_summary}"
        super().__init__(message)

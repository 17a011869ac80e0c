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
        self.flag = flag
        super().__init__(f"dim '{dim_name}' is unbound ({where}); pass --dim {flag}")

    @classmethod
    def of_all(cls, errors: "list[UnboundDimError]") -> "UnboundDimError":
        """One error naming every unbound dim of ``errors`` (each name once, first place it is read).

        >>> str(UnboundDimError.of_all([UnboundDimError("batch", "ids[0]"), UnboundDimError("seq", "ids[1]"),
        ...                             UnboundDimError("batch", "mask[0]")]))
        "dims 'batch' (ids[0]) and 'seq' (ids[1]) are unbound; pass --dim batch=VALUE --dim seq=VALUE"
        """
        first_of: dict[str, UnboundDimError] = {}
        for error in errors:
            first_of.setdefault(error.dim_name, error)
        unique = list(first_of.values())
        if len(unique) == 1:
            return unique[0]
        first = unique[0]
        named = [f"'{e.dim_name}' ({e.where})" for e in unique]
        combined = cls(first.dim_name, first.where)
        combined.args = (f"dims {', '.join(named[:-1])} and {named[-1]} are unbound; pass "
                         + " ".join(f"--dim {e.flag}" for e in unique),)
        return combined


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

"""The ``planner`` command: parses options, calls the library, hands results to :mod:`planner.render`.

Errors the user can fix (:class:`~planner.core.errors.PlannerError`) are caught once, in :func:`main`,
and printed as one line on stderr with exit code 2; a traceback appears only with ``--debug``.
stdout carries only the table or the JSON, so ``--json | jq`` works.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console

from planner.core.errors import InputError, PlannerError

__all__ = ["app", "main"]

app = typer.Typer(
    name="planner",
    help=(
        "Find how to split the training of an ONNX model over N devices: the time-per-step vs "
        "memory-per-device Pareto frontier of parallelization strategies, exported as launch plans."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

stderr = Console(stderr=True)
_state = {"debug": False}

# Option types, defined once so every command's help reads the same.
ModelArg = Annotated[Path, typer.Argument(help="ONNX model file (weights may be stripped).", show_default=False)]
DimOpt = Annotated[
    Optional[list[str]],
    typer.Option("--dim", help="Bind a symbolic dim, NAME=VALUE (repeatable), e.g. --dim batch=32.", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output on stderr.")]


def parse_dims(values: list[str] | None) -> dict[str, int]:
    """Parse ``--dim NAME=VALUE`` options into ``{name: value}``.

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
            raise InputError(f"cannot read --dim '{text}'; write NAME=VALUE, e.g. --dim batch=32")
        try:
            number = int(value)
        except ValueError:
            raise InputError(f"--dim {name} needs an integer value (got '{value}'), e.g. --dim {name}=32") from None
        if number <= 0:
            raise InputError(f"--dim {name} must be a positive integer (got {number})")
        dims[name] = number
    return dims


def handle_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Run a command, turning our errors into one line on stderr and exit code 2.

    Internal bugs print one line and exit 1; ``--debug`` shows their traceback instead.
    """

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            command(*args, **kwargs)
        except PlannerError as error:
            if _state["debug"]:
                raise
            stderr.print(f"[red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(error.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - the last line of defence
            if _state["debug"]:
                raise
            stderr.print(
                f"[red]internal error:[/] {type(error).__name__}: {error} "
                "(rerun with --debug for the traceback, and please report it)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")] = False,
) -> None:
    _state["debug"] = debug


@app.command()
@handle_errors
def inspect(model: ModelArg, dim: DimOpt = None, json_out: JsonOpt = False) -> None:
    """Summarise a model: node counts, op types, parameters, FLOPs, repeated blocks, opaque ops.

    Example: planner inspect examples/gpt2.onnx --dim batch=8 --dim seq=1024
    """
    from importers import import_model
    from importers.summary import summarize
    from planner import render

    graph = import_model(model, parse_dims(dim))
    summary = summarize(graph)
    for warning in graph.warnings:
        stderr.print(f"[yellow]warning:[/] {warning}", highlight=False)
    render.summary(summary, json_out=json_out)


def main() -> None:
    """Console-script entry point."""
    app()

"""Error messages of planner.core.errors that users copy into their shell."""

from __future__ import annotations

import shlex

import pytest

from planner.core.errors import UnboundDimError


@pytest.mark.parametrize("name", ["seq", "batch size", "it's", 'a"b', "x[0]"])
def test_unbound_dim_flag_survives_the_shell(name):
    # the suggested flag, split by a POSIX shell, gives back exactly NAME=VALUE
    message = str(UnboundDimError(name, "input[0]"))
    suggested = message.split("pass --dim ", 1)[1]
    assert shlex.split(suggested) == [f"{name}=VALUE"]

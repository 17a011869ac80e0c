"""``--dim`` values: whole numbers, with the binary k/m suffixes context lengths are named by."""

import pytest

from planner.core.dims import parse_dims
from planner.core.errors import InputError


@pytest.mark.parametrize(("text", "value"), [
    ("seq=32k", 32 * 1024), ("seq=128K", 131_072), ("seq=1m", 1_048_576), ("batch=8", 8), ("seq= 4k ", 4096),
])
def test_suffixes_multiply_by_powers_of_1024(text, value):
    assert parse_dims([text]) == {text.partition("=")[0]: value}


@pytest.mark.parametrize(("text", "said"), [
    ("seq=k", "needs an integer value (got 'k')"),
    ("seq=1.5k", "needs an integer value (got '1.5k')"),
    ("seq=32g", "needs an integer value (got '32g')"),
    ("seq=0k", "must be a positive integer (got 0)"),
    ("seq=-1k", "must be a positive integer (got -1024)"),
])
def test_what_is_not_a_count_is_refused_in_one_line(text, said):
    with pytest.raises(InputError, match=None) as caught:
        parse_dims([text])
    assert said in str(caught.value) and "\n" not in str(caught.value)

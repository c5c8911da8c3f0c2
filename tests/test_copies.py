"""A value computed under one name and copied to another it goes by from then on takes the
second name where it is computed (pallasgen.rendering.copies), where that changes no value."""

from __future__ import annotations

import pytest

from pallasgen.rendering.copies import without_copies

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)


def test_a_copy_names_the_value_where_it_is_computed():
    source = "def f(x_ref, z_ref):\n    acc_k = x_ref[...]\n    acc = acc_k  # the let\n    z_ref[...] = acc * 2\n"
    assert without_copies(source) == "def f(x_ref, z_ref):\n    acc = x_ref[...]\n    z_ref[...] = acc * 2\n"


def test_a_name_a_tuple_unpacks_to_takes_the_copys_name():
    source = "def f(x):\n    (a,) = g(x)\n    c, _, d = h(x)\n    b = a\n    e = d\n    return b + c + e\n"
    assert without_copies(source) == "def f(x):\n    (b,) = g(x)\n    c, _, e = h(x)\n    return b + c + e\n"


def test_chains_of_copies_in_nested_functions_go_too():
    source = (
        "def f(x):\n    def g():\n        a = x + 1\n        b = a\n        c = b\n        return c\n\n    return g()\n"
    )
    assert without_copies(source) == "def f(x):\n    def g():\n        c = x + 1\n        return c\n\n    return g()\n"


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    a = x + 1\n    b = a\n    return a + b\n",  # the first name is read again
        "def f(x):\n    a = x + 1\n    b = a\n    b = b * 2\n    return b\n",  # the second is bound again
        "def f(x, b):\n    a = x + 1\n    b = a\n    return b\n",  # the second is a parameter
        "def f(x):\n    a = x + 1\n    c = b\n    b = a\n    return b + c\n",  # the second is read before the copy
        "def f(x):\n    if x:\n        a = x + 1\n    b = a\n    return b\n",  # not in the same block
        "def f(x):\n    a += 1\n    b = a\n    return b\n",  # not a plain assignment
    ],
)
def test_copies_that_renaming_would_change_stay(source):
    assert without_copies(source) == source

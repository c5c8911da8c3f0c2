"""The functions a spec may call, by how they type their result."""

from __future__ import annotations

from pallasgen.analysis.dtypes import DTYPES

# Results are floats: an integer argument is converted to f32 first.
FLOAT_FUNCTIONS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "sin", "cos"})
# Results have the argument's dtype.
SAME_TYPE_FUNCTIONS = frozenset({"abs", "relu", "floor", "ceil"})
FUNCTION_ARITY = {
    **{name: 1 for name in FLOAT_FUNCTIONS | SAME_TYPE_FUNCTIONS},
    "maximum": 2,
    "minimum": 2,
    "clip": 3,
    "where": 3,
    **{name: 1 for name in DTYPES},  # casts
}

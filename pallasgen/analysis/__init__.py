"""Analysis: every language-level check with its position, dtypes and type inference, the matrix product, and the iteration space."""

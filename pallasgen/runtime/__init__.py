"""What generated modules run on: the code every kernel shares, written once.

A generated module imports `pallasgen.runtime.support` (as `rt`) for the checks of a
call, the dispatch to the kernel of the platform compiled for, the choice of blocks
and launch options at call time, and the small functions kernel bodies call. Nothing
here is imported by `pallasgen build`: the build path reads only `constants`, the
facts that the generator and the runtime share, which imports no jax.
"""

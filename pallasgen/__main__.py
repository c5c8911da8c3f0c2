"""`python -m pallasgen`: the `pallasgen` command."""

from pallasgen.cli import main

main(prog_name="pallasgen")

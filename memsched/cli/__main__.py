"""`python -m memsched.cli`: the same as the `memsched` console script."""

from memsched.cli import run

run()

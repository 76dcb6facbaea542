"""`python -m search --space spaces/mnist.yaml`: see search/cli.py."""

from search.cli import run

run()

"""`python -m search --space spaces/mnist.yaml`: see search/cli.py."""

import sys

from search.cli import main

sys.exit(main())

"""`python -m edgespec.cli`: the same as the `edgespec` command."""

import sys

from edgespec.cli import main

sys.exit(main())

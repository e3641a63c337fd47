"""`python -m edgespec.cli`: the same as the `edgespec` command."""

import sys

from edgespec.__main__ import main

sys.exit(main())

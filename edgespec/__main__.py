"""The `edgespec` command and `python -m edgespec`.

A launcher that imports nothing heavy itself, so that Ctrl+C at any moment,
also while the command line's modules are still being imported, ends the
command with a message instead of a traceback."""

import os
import sys

from edgespec.errors import EXIT_INTERRUPTED  # stdlib only: nothing heavy


def main() -> int:
    try:
        from edgespec.cli import main as cli_main

        code = cli_main()
    except KeyboardInterrupt:  # one the command line did not catch: it came while it was being imported
        print("\nedgespec: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        # Ended here, not by returning: CPython exits by the signal itself, whatever
        # the status, when the Ctrl+C was raised while a library ran code of its own
        # (1 exit in 6 here, while importing or loading a model). Cleanup has run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The `edgespec` command and `python -m edgespec`.

A launcher that imports nothing heavy itself, so that Ctrl+C at any moment,
also while the command line's modules are still being imported, ends the
command with a message instead of a traceback."""

import os
import signal
import sys

from edgespec.errors import EXIT_INTERRUPTED, Terminated  # stdlib only: nothing heavy


def main() -> int:
    _open_closed_streams()
    try:
        from edgespec.cli import main as cli_main

        code = cli_main()
    except Terminated as e:  # its cleanup has run: end by the signal, as a shell expects (143, 129)
        return _end_by(e.args[0])
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


def _end_by(signum: int) -> int:
    """End the process by `signum`, its default action restored, with what is written flushed;
    128 + signum where raising it did not end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a terminal hung up: nothing left to tell
            pass
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
    return 128 + signum


def _open_closed_streams() -> None:
    """A stream closed before the command started (`edgespec chats >&-`) is None in
    Python, and every write to it an AttributeError: it reads and writes nothing
    instead, as in a shell."""
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115 (open for the process' life)


if __name__ == "__main__":
    sys.exit(main())

"""The `edgespec` command: argparse entry and subcommands.

The one place that turns errors into messages and exit codes: everything
below raises EdgespecError (or ValueError for bad settings) with a message
written for the user. With no command it opens the chat app; each family of
commands is a module here (generate, models, chats, serve, worker) that adds
its parsers, options.py holds the options they share, and signals.py how the commands
that hold the models end on SIGTERM and SIGHUP.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from edgespec import __version__
from edgespec.cli import caches, chats, files, generate, models, serve, worker
from edgespec.cli.options import (add_cache_options, add_load_options, add_model_names, add_no_draft,
                                  add_rpc_options, load_settings_from_args)
from edgespec.cli.output import error, quiet_stdout
from edgespec.errors import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_INTERRUPTED, EdgespecError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # inside: --version writes to stdout, and imports llama.cpp
        handler: Callable[[argparse.Namespace], int] = getattr(args, "handler", _cmd_app)
        code = handler(args) or 0
        sys.stdout.flush()  # a reader that went away shows here, not in Python's flush at exit
        return code
    except BrokenPipeError:  # `edgespec chats | head -1`: end quietly, as `ls` does
        quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (EdgespecError, ValueError) as e:
        error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nedgespec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # what is not wrapped in an EdgespecError: writing the output (a full disk, /dev/full)
        quiet_stdout()
        error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgespec",
        description="Chat with local GGUF models, made faster by lossless speculative decoding. "
        "With no command, opens the chat app.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show versions and llama.cpp's backend, then exit")
    app = parser.add_argument_group("chat app (no command)")
    add_model_names(app)
    add_no_draft(app)
    add_load_options(app)
    add_rpc_options(app)
    add_cache_options(app)
    app.add_argument("--root", metavar="DIR", type=files.home_path("--root"),
                     help="the project folder files are attached from and edits written to (default: the current "
                          "folder)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for family in (generate, models, chats, files, caches, serve, worker):
        family.add_parsers(sub)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' parsers are of its class too), except that help
    written into a pipe whose reader went away raises there, so that main ends it quietly
    with 141 as every output: argparse ignores the error, and the command ended with 0."""

    def _print_message(self, message, file=None):
        if message and file is sys.stdout:
            file.write(message)
            file.flush()  # a reader gone shows here, not in Python's flush at exit
        else:  # usage errors go to stderr, where there is no one left to tell
            super()._print_message(message, file)


class _VersionAction(argparse.Action):
    """--version: edgespec's version and what llama.cpp was built with (CPU, Metal, CUDA)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from edgespec.llama import system_info

        info = system_info()
        gpu = "GPU offload available" if info["gpu_offload"] else "no GPU offload"
        rpc = "RPC available (edgespec worker, --rpc)" if info["rpc"] else "no RPC (scripts/install.sh builds it)"
        print(f"edgespec {__version__}\nllama-cpp-python {info['llama_cpp_python']}, "
              f"backend {info['backend']} ({gpu}; {rpc})\n{info['system_info']}", flush=True)  # a reader gone shows in main
        parser.exit()


def _cmd_app(args: argparse.Namespace) -> int:
    """The chat app; a missing or broken model is shown there (with how to get it), not raised."""
    from edgespec.tui import run_app

    load = load_settings_from_args(args)
    run_app(pair=args.pair, target=args.target, draft=args.draft, no_draft=args.no_draft, rpc=load.rpc,
            cache=load.cache, load=load, root=args.root)
    return 0

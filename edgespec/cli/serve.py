"""`edgespec serve`: the OpenAI-compatible HTTP API (edgespec.server) on the models the options name."""

from __future__ import annotations

import argparse
import sys

from edgespec.cli.bars import stderr_progress
from edgespec.cli.options import (add_model_options, add_sampling_options, add_template_option, chosen_pair,
                                  engine_from_args, load_settings_from_args, params_from_args, port_or_any)
from edgespec.cli.output import banner
from edgespec.limits import SERVER_MAX_TOKENS
from edgespec.errors import EdgespecError

API_KEY_ENV = "EDGESPEC_API_KEY"
"""Where --api-key is read from when it is not given (a key on the command line shows in `ps`)."""


def add_parsers(sub) -> None:
    """`serve`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP API for editors and scripts",
                       description="Load the models once and serve the OpenAI API (/v1/chat/completions, "
                                   "/v1/completions, /v1/models) with speculation underneath. The sampling options "
                                   "are the defaults for requests that leave them out. Ctrl+C stops it.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --api-key)")
    p.add_argument("--port", type=port_or_any, default=8080, help="default 8080 (0: any free port)")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; a key given here is "
                        "visible to other users in `ps`)")
    p.add_argument("--insecure-no-api-key", action="store_true",
                   help="allow a non-loopback --host with no API key: anyone who can reach the port can use it")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN call the API (repeatable; default: none)")
    add_template_option(p)
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    add_model_options(p)
    add_sampling_options(p, max_tokens=SERVER_MAX_TOKENS)
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    try:
        from edgespec import server
    except ImportError as e:
        raise EdgespecError(f"`edgespec serve` needs the serve extra ({e.name} is missing): "
                            "pip install 'edgespec[serve]', or run scripts/install.sh") from None

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    warning = server.check_exposure(args.host, api_key=api_key, allow_no_key=args.insecure_no_api_key)
    if warning:
        print(banner(warning), file=sys.stderr)
    model_id = _served_model_id(args)
    load = load_settings_from_args(args)  # checked before the port is taken
    settings = server.ServerSettings(
        model_id=model_id, api_key=api_key, defaults=params_from_args(args), max_tokens=args.max_tokens,
        template=args.template, cors_origins=tuple(args.cors_origin))
    sock = server.bind(args.host, args.port)
    base = server.url(sock) + "/v1"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log = logging.getLogger("edgespec.server")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        app = server.create_app(lambda: engine_from_args(args, progress=stderr_progress(), settings=load), settings)
        print(f"edgespec serve: loading {model_id} ...", file=sys.stderr)
        server.run(app, sock, verbose=args.verbose, on_ready=lambda: print(
            f"edgespec serve: ready at {base} (model \"{model_id}\"{', API key required' if api_key else ''}); "
            "Ctrl+C stops it", file=sys.stderr, flush=True))
    finally:
        # The log is the command's, not the process's: a caller that goes on (a test, an
        # embedding program) must not have the server's lines written to a stream it closed.
        log.removeHandler(handler)
    print("edgespec serve: stopped", file=sys.stderr)
    return 0


def _served_model_id(args: argparse.Namespace) -> str:
    """The name clients ask for: the pair's (or the target's) registry name, or a file's stem."""
    from pathlib import Path

    from edgespec.models.fetch import is_path_like
    from edgespec.models.registry import HUB_PREFIX

    if args.target:
        named = not (is_path_like(args.target) or args.target.startswith(HUB_PREFIX))
        return args.target if named else Path(args.target).stem
    return chosen_pair(args)


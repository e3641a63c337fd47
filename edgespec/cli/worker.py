"""`edgespec worker`: this machine's devices served to another edgespec over llama.cpp RPC,
on a loopback address unless --allow-remote is given."""

from __future__ import annotations

import argparse
import sys

from edgespec import net
from edgespec.cli.files import home_path
from edgespec.cli.options import port
from edgespec.cli.output import banner
from edgespec.errors import EdgespecError


def add_parsers(sub) -> None:
    """`worker`, on the subparsers of the `edgespec` parser."""
    p = sub.add_parser("worker", help="serve this machine's CPU or GPU to another edgespec (llama.cpp RPC)",
                       description="Run llama.cpp's RPC server: another machine's `edgespec --rpc HOST:PORT` then "
                                   "keeps some of its target's layers here. llama.cpp's RPC has no authentication "
                                   "and no encryption: anyone who reaches the port can use this machine's devices "
                                   "and memory. Ctrl+C stops it.")
    p.add_argument("--host", default="127.0.0.1",
                   help="IPv4 address to listen on (default 127.0.0.1: this machine only; any other needs --allow-remote)")
    p.add_argument("--port", type=port, default=net.RPC_PORT, help=f"default {net.RPC_PORT}")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host: anyone who can reach the port can use the worker "
                        "(only on a network you trust)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    p.add_argument("--device", metavar="NAME[,NAME...]", default=None,
                   help="devices to serve (default: the GPUs, else the CPU); --list-devices names them")
    p.add_argument("--list-devices", action="store_true", help="list this machine's devices and exit")
    p.add_argument("--cache", metavar="DIR", default=None, type=home_path("--cache"),
                   help="keep the tensors clients send in DIR, so that a reload sends hashes instead of weights")
    p.set_defaults(handler=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    import os
    import socket
    import time

    from edgespec.llama import rpc
    from edgespec.models.progress import human_bytes

    if args.list_devices:
        for _, d in rpc.local_devices():
            print(f"{d.name}: {d.description} ({d.kind}, {human_bytes(d.free)} free of {human_bytes(d.total)})")
        return 0
    warning = check_worker_exposure(args.host, allow_remote=args.allow_remote)
    host = net.worker_address(args.host)
    if not rpc.available():
        rpc.require()  # raises with how to get a build that has it
    devices = rpc.worker_devices(args.device.split(",") if args.device else None)
    threads = args.threads or os.cpu_count() or 1
    endpoint = net.Endpoint(host, args.port)
    try:  # ggml-rpc only says "Failed to create server socket": find out why first
        with socket.create_server((host, args.port)):
            pass
    except OSError as e:
        raise EdgespecError(f"cannot listen on {endpoint}: {e.strerror or e}") from None
    if warning:
        print(banner(warning), file=sys.stderr)
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    for _, d in devices:
        print(f"edgespec worker: serving {d.name} ({d.description}, {d.kind}): {human_bytes(d.free)} free of "
              f"{human_bytes(d.total)}", file=sys.stderr)
    thread = rpc.start_server(endpoint, devices, n_threads=threads, cache_dir=args.cache)
    cache = f", cache {args.cache}" if args.cache else ""
    print(f"edgespec worker: listening on {endpoint} ({threads} threads{cache}); use it with --rpc {endpoint}. "
          "Ctrl+C stops it", file=sys.stderr, flush=True)
    while thread.is_alive():
        thread.join(0.5)
    time.sleep(0.1)
    raise EdgespecError(f"the RPC server on {endpoint} stopped (see llama.cpp's message above)")


def check_worker_exposure(host: str, *, allow_remote: bool) -> str | None:
    """Refuse a non-loopback address without --allow-remote; with it, the warning to print."""
    return net.check_exposure(
        host, guarded=False, allowed=allow_remote,
        refusal=f"refusing to listen on {host}: llama.cpp's RPC has no authentication and no encryption, so "
                "anyone who can reach the port could use this machine's devices and memory. Pass --allow-remote "
                "to do it anyway, on a network you trust",
        warning=f"WARNING: the worker listens on {host}. llama.cpp's RPC has NO authentication and NO encryption:\n"
                "anyone who can reach this port can use this machine's devices and memory, and read what it "
                "computes.\nOnly do this on a network you trust, or behind a firewall / SSH tunnel.")

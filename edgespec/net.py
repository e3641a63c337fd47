"""Network addresses as a user names them: hosts to listen on, RPC workers'
endpoints and a model's split across them, and which addresses only this
machine can reach. Pure: no connections, no llama.cpp, so that every face parses
and checks them the same way, and none reaches into the native layer for it."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from edgespec.limits import ascii_number

RPC_PORT = 50052
"""llama.cpp's RPC port (rpc-server's default), also `edgespec worker`'s."""


def _bare(host: str) -> str:
    """An IPv6 literal without its brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `host` names as the system reads it when binding or connecting, or None
    for a host name. IPv4 in inet_aton's forms as well (127.1, 127.0.1, 0x7f.1, 0177.0.0.1,
    2130706433), which getaddrinfo and llama.cpp's RPC accept and ipaddress refuses; an IPv6
    literal with or without brackets."""
    bare = _bare(host)
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    # inet_aton stops at a space and takes what comes before, where getaddrinfo looks up a name
    if re.fullmatch(r"[0-9A-Fa-fXx.]+", bare):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            pass
    return None


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8 however it is written,
    ::1, ::ffff:127.x.x.x, localhost). A host name other than localhost may resolve to
    anything, so it counts as exposed."""
    if host.lower() == "localhost":
        return True
    address = ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback


def is_ipv6(host: str) -> bool:
    address = ip_address(host)
    return address is not None and address.version == 6


def is_host(host: str) -> bool:
    """An IP address (IPv6 possibly in brackets) or a DNS name's syntax."""
    if ip_address(host) is not None:
        return True
    labels = host.rstrip(".").split(".")
    return 0 < len(host) <= 253 and all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", label)
                                        for label in labels)


def check_exposure(host: str, *, guarded: bool, allowed: bool, refusal: str, warning: str) -> str | None:
    """The one rule for listening on `host`: ValueError for what is not a host;
    nothing to say for a loopback address, or where something guards the port
    (`guarded`, e.g. an API key); else ValueError(`refusal`) unless the user
    `allowed` it, and then the `warning` to show."""
    if not is_host(host):
        raise ValueError(f"--host {host!r} is not a host name or an IP address (e.g. 127.0.0.1, ::1, 0.0.0.0)")
    if is_loopback(host) or guarded:
        return None
    if not allowed:
        raise ValueError(refusal)
    return warning


# -- llama.cpp RPC workers ------------------------------------------------------------

IPV4_ONLY = "llama.cpp's RPC speaks IPv4 only"
"""ggml-rpc opens AF_INET sockets on both sides: a worker listens on an IPv4
address, and a client resolves a worker's name to an IPv4 one."""


@dataclass(frozen=True)
class Endpoint:
    """One worker: host and port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """'HOST:PORT[,HOST:PORT...]' as llama.cpp's --rpc takes it; ValueError says what is wrong."""
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if host.startswith("[") or is_ipv6(host) or is_ipv6(item):
            raise ValueError(f"RPC worker {item!r}: {IPV4_ONLY}: name the worker by an IPv4 address or a "
                             f"host name, e.g. 127.0.0.1:{RPC_PORT}")
        if ":" in host:
            raise ValueError(f"RPC worker {item!r}: expected HOST:PORT with one ':', e.g. 192.168.1.7:{RPC_PORT}")
        if not sep or not host:
            raise ValueError(f"RPC worker {item!r}: expected HOST:PORT, e.g. 192.168.1.7:{RPC_PORT}")
        if not is_host(host):
            raise ValueError(f"RPC worker {item!r}: {host!r} is not a host name or an IPv4 address")
        try:
            ascii_number(port)
        except ValueError:
            raise ValueError(f"RPC worker {item!r}: the port must be written with the digits 0-9") from None
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RPC worker {item!r}: the port must be a number from 1 to 65535")
        address = ip_address(host)  # 127.1 and 127.0.0.1 are one worker, named the usual way
        endpoint = Endpoint(str(address) if address else host, int(port))
        if endpoint in endpoints:
            raise ValueError(f"RPC worker {endpoint} is listed twice")
        endpoints.append(endpoint)
    if not endpoints:
        raise ValueError(f"no RPC worker given: expected HOST:PORT[,HOST:PORT...], e.g. 127.0.0.1:{RPC_PORT}")
    return tuple(endpoints)


def worker_address(host: str) -> str:
    """The IPv4 address a worker listens on for `host` (localhost: 127.0.0.1);
    ValueError for anything else, which llama.cpp's RPC server cannot bind."""
    if host.lower() == "localhost":
        return "127.0.0.1"
    address = ip_address(host)
    if address is None:
        raise ValueError(f"--host {host!r}: a worker listens on an IPv4 address (e.g. 127.0.0.1, or 0.0.0.0 "
                         f"for every interface), not a host name")
    if address.version != 4:
        raise ValueError(f"--host {host}: {IPV4_ONLY}: listen on 127.0.0.1, or 0.0.0.0 for every interface")
    return str(address)


@dataclass(frozen=True)
class Split:
    """Where a model's offloaded layers go: RPC workers' devices (llama.cpp's --rpc),
    then this machine's GPUs, weighted by tensor_split (llama.cpp's --tensor-split;
    empty: by free memory)."""

    workers: tuple[Endpoint, ...]
    tensor_split: tuple[float, ...] = ()
    local_output: bool = False
    """Keep the output layer on this machine's CPU: a pass then brings back a
    hidden state per position instead of n_vocab logits (~0.6 MB for a 150k
    vocabulary), at the cost of the output layer's memory and compute here."""

"""Addresses as a user names them (edgespec/net.py): which hosts only this machine
can reach, and how an RPC worker's endpoint is written. Pure: no connection is made."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from edgespec.net import Endpoint, check_exposure, ip_address, is_loopback, parse_endpoints, worker_address

LOOPBACK = ["127.0.0.1", "127.1", "127.0.1", "127.255.255.254", "0x7f.1", "0177.0.0.1", "2130706433",
            "localhost", "LocalHost", "::1", "[::1]", "::ffff:127.0.0.1"]
EXPOSED = ["0.0.0.0", "0", "192.168.1.5", "128.1", "0127.0.0.1", "::", "[::]", "fe80::1", "myhost",
           "localhost.example", "127.0.0.1 evil", "127.0.0.1.", "127.1\n"]


def system_address(host: str):
    """The address the system binds or connects to for a numeric host (no name lookup), or None."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(socket.getaddrinfo(bare, 0, flags=socket.AI_NUMERICHOST)[0][4][0])
    except (OSError, UnicodeError):
        return None


@pytest.mark.parametrize("host", LOOPBACK)
def test_every_spelling_of_a_loopback_address_is_loopback(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", EXPOSED)
def test_anything_else_counts_as_reachable_from_other_machines(host):
    assert not is_loopback(host)


@pytest.mark.parametrize("host", [h for h in LOOPBACK + EXPOSED if "localhost" not in h.lower()])
def test_an_address_reads_as_the_system_reads_it(host):
    """127.1 and 0177.0.0.1 are 127.0.0.1 to inet_aton and getaddrinfo, 0127.0.0.1 is
    87.0.0.1 (octal), and text after a space makes a name, not an address."""
    assert ip_address(host) == system_address(host)


def test_a_short_loopback_address_is_served_without_a_guard_and_listened_on_as_written_out():
    assert check_exposure("127.1", guarded=False, allowed=False, refusal="exposed", warning="w") is None
    with pytest.raises(ValueError, match="exposed"):
        check_exposure("0127.0.0.1", guarded=False, allowed=False, refusal="exposed", warning="w")
    assert worker_address("127.1") == worker_address("0x7f.1") == "127.0.0.1"


def test_a_worker_named_by_a_short_address_is_the_same_worker():
    assert parse_endpoints("127.1:50052") == (Endpoint("127.0.0.1", 50052),)
    with pytest.raises(ValueError, match="listed twice"):
        parse_endpoints("127.1:50052,127.0.0.1:50052")


@pytest.mark.parametrize("text", ["gpu-box:50052:1", "127.0.0.1:50052:1", "a:b:c"])
def test_an_extra_colon_is_said_to_be_one_not_blamed_on_ipv6(text):
    with pytest.raises(ValueError) as raised:
        parse_endpoints(text)
    message = str(raised.value)
    assert "expected HOST:PORT with one ':'" in message and "IPv" not in message  # a worker speaks IPv4 only


@pytest.mark.parametrize("port", ["٥٠٥٠", "５０５０", "५०५०", "5²"])
def test_a_worker_port_written_in_digits_other_than_0_9_is_refused_saying_so(port):
    """int() reads '٥٠٥٠' and '５０５０' as 5050, and isdigit() passes '²', which int() then
    refuses with its own words: the port is read as every other number typed is."""
    with pytest.raises(ValueError, match=r"RPC worker '127\.0\.0\.1:.+': the port must be written with the "
                                         r"digits 0-9"):
        parse_endpoints(f"127.0.0.1:{port}")

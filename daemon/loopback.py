"""Which listening addresses stay on this machine.

flashd's network front ends (the daemon's ZeroMQ ROUTER, `flashd http`) listen on loopback unless
told otherwise: the ZeroMQ protocol has no authentication at all, and the HTTP gateway has only an
optional API key. This module says whether a host or a ZeroMQ endpoint is loopback, so that each
front end can refuse a non-loopback address without the opt-in it needs (README.md, "Security").
"""
from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host", "check_zmq_address"]


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1, [::1]). Anything else --
    `0.0.0.0`, `*`, `::`, an interface or a DNS name -- may be reachable from other machines."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_zmq_address(address: str, allow_remote: bool) -> str:
    """`tcp://HOST:PORT` (PORT may be `*`: any free port) or `ipc://PATH`. HOST must be a
    loopback address unless allow_remote: the protocol has no authentication. ValueError with
    the reason otherwise."""
    scheme, sep, rest = address.partition("://")
    if not sep or not rest:
        raise ValueError(f"--zmq {address!r}: expected tcp://HOST:PORT or ipc://PATH")
    if scheme == "ipc":
        return address                      # a socket file: its directory's permissions guard it
    if scheme != "tcp":
        raise ValueError(f"--zmq {address!r}: only tcp:// and ipc:// addresses are served")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
        raise ValueError(f"--zmq {address!r}: expected tcp://HOST:PORT with PORT a number or *")
    if not allow_remote and not is_loopback_host(host):
        raise ValueError(f"--zmq {address!r}: {host} is not a loopback address; the ZeroMQ protocol has no "
                         f"authentication (anyone who can connect can use the model and its files), so serving "
                         f"other machines needs --zmq-allow-remote")
    return address

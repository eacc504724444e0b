"""The address rule (:func:`choose`; docs/run.md, "Addresses"), applied to a node's launch before any process
starts (:func:`addressing`), and network look-ups with a deadline."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..argtypes import host_port, ip_address
from ..errors import UsageError

RESOLVE_TIMEOUT_S = 10.0
"""getaddrinfo has no timeout of its own; a resolver that does not answer is given this long."""


def resolve(host: str, *, flag: str | None, timeout: float = RESOLVE_TIMEOUT_S) -> tuple[str, ...]:
    """Every address of ``host``; when it does not resolve in time, a one-line :class:`UsageError`
    naming ``flag`` (``flag`` None: no address)."""
    result: list[tuple[str, ...] | str] = []

    def look_up() -> None:
        try:
            result.append(
                tuple(dict.fromkeys(str(a[4][0]) for a in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))
            )
        except (OSError, UnicodeError) as e:
            result.append(getattr(e, "strerror", None) or str(e))

    t = threading.Thread(target=look_up, name="numarun-resolve", daemon=True)
    t.start()
    t.join(timeout)
    why = result[0] if result else f"the name did not resolve within {timeout:.0f} s"
    if isinstance(why, tuple) or flag is None:
        return () if isinstance(why, str) else why
    raise UsageError(
        f"bad {flag} {host!r}: {why}; expected a name that resolves on this node (DNS or /etc/hosts) or an IP address"
    )


def scoped_address(name: tuple[Any, ...]) -> str:
    """The address of a socket name (``getsockname()``), a link-local one with its interface: ``fe80::1%eth0``.
    An IPv6 name carries the scope as an interface index (element 3), never in the address itself; an index
    with no interface of that name left is written as the number, which ``getaddrinfo`` reads as well."""
    address, scope = str(name[0]), name[3] if len(name) > 3 else 0
    if not scope:
        return address
    try:
        return f"{address}%{socket.if_indextoname(int(scope))}"
    except OSError:
        return f"{address}%{scope}"


def route_address(host: str, port: int, *, zone: bool = False) -> str | None:
    """The address of this machine's interface that reaches ``host`` (no packet is sent); None when
    there is no route or ``host`` does not resolve. ``zone``: a link-local address keeps its ``%interface``
    (what a socket binds to), else it is left out (what addresses are compared by)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            name = s.getsockname()
    except (OSError, UnicodeError, IndexError):
        return None
    return scoped_address(name) if zone else str(name[0])


def sockaddr(host: str, port: int) -> tuple[int, tuple[object, ...]]:
    """(family, address) to bind or connect to ``host``:``port``: a scoped link-local address (``fe80::1%eth0``)
    keeps its scope, which ``socket.bind((host, port))`` drops (and the kernel then refuses with EINVAL)."""
    family, _, _, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST if ip_address(host) is not None else 0
    )[0]
    return int(family), tuple(addr)


def own_addresses() -> dict[str, str]:
    """This host's interface addresses (IPv4 and IPv6, zone removed) -> interface name."""
    import psutil

    return {
        a.address.partition("%")[0]: name
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }


def accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def await_endpoint(
    host: str, port: int, seconds: float, source: str | None = None, give_up: Callable[[], bool] = lambda: False
) -> bool:
    """Wait quietly (torch's store client retries in C++ and logs each try) until host:port accepts
    connections; after ``seconds`` or ``give_up()``: False, or with ``source`` (what ``seconds`` come
    from) a one-line :class:`UsageError`."""
    deadline = time.monotonic() + seconds
    while not accepts(host, port):
        if time.monotonic() >= deadline or give_up():
            if source is None:
                return False
            raise UsageError(
                f"bad rendezvous endpoint {host_port(host, port)!r}: nothing accepted a connection there within "
                f"{seconds:.0f} s ({source}); expected node rank 0's numarun running and that address reachable from "
                "here"
            )
        time.sleep(0.5)
    return True


def loopback(addr: str) -> bool:
    return addr == "localhost" or bool((ip := ip_address(addr)) and ip.is_loopback)


def usable(addr: str) -> bool:
    """Neither loopback nor link-local: another node may reach this host at it."""
    return bool((ip := ip_address(addr)) and not (ip.is_loopback or ip.is_link_local or ip.is_unspecified))


def choose(
    *,
    multi_node: bool,
    endpoint: str,
    endpoint_addrs: Sequence[str],
    own: Mapping[str, str],
    route: str | None,
    prefer: Sequence[str] = (),
) -> str | None:
    """What this node's workers and the other nodes connect to (pure): loopback for one node or an endpoint
    written as loopback; else an address of ``own`` neither loopback nor link-local, in the endpoint's
    family: ``route``, else one on a ``prefer`` interface (the plan's NICs), else the first; else None."""
    v6 = bool(endpoint_addrs) and all(":" in a for a in endpoint_addrs)
    if not multi_node or loopback(endpoint):
        return "::1" if v6 else "127.0.0.1"
    ranked = [route or "", *(a for a, name in own.items() if name in prefer), *own]
    fits = sorted((a for a in ranked if a in own and usable(a)), key=lambda a: (":" in a) != v6)
    return fits[0] if fits else None


def hosts_endpoint(host: str, endpoint_addrs: Sequence[str], own: Mapping[str, str], hostname: str) -> bool:
    """Whether the endpoint is this host: its name, or an address of it (pure)."""
    return host in ("localhost", hostname) or any(loopback(a) or a.partition("%")[0] in own for a in endpoint_addrs)


@dataclass(frozen=True)
class Addressing:
    """A node's addresses: ``local_addr`` (:func:`choose`), c10d's ``is_host`` to pass (None: torch's own
    test is right, or the user set it), ``hosts_store`` (else wait for it), gloo's interface in ``env``."""

    local_addr: str | None
    is_host: bool | None
    hosts_store: bool
    env: tuple[tuple[str, str], ...] = ()


def addressing(
    *,
    multi_node: bool,
    backend: str,
    endpoint: tuple[str, int],
    flag: str,
    node_rank: int = 0,
    given_local_addr: str | None = None,
    given_is_host: bool | None = None,
    prefer: Sequence[str] = (),
) -> Addressing:
    """The rule applied to one node; the endpoint must resolve (:func:`resolve`, naming ``flag``). Whether
    the node hosts the store comes from its interfaces, not from what its hostname resolves to."""
    host, port = endpoint
    addrs = () if host == "localhost" else resolve(host, flag=flag)
    own = own_addresses()
    mine = (
        resolve(given_local_addr, flag="--local-addr")[0]
        if given_local_addr
        else choose(
            multi_node=multi_node,
            endpoint=host,
            endpoint_addrs=addrs,
            own=own,
            prefer=prefer,
            route=route_address(addrs[0], port) if multi_node and addrs else None,
        )
    )
    is_host = given_is_host
    if backend == "static":
        hosts = node_rank == 0
    elif backend != "c10d":
        hosts = False  # an etcd server: no node of the job hosts it, every node waits for it (quietly)
    else:
        hosts = hosts_endpoint(host, addrs, own, socket.gethostname()) if is_host is None else is_host
        # torch's own test (and its fallback to a client) is right for these names; it errs beyond them
        if given_is_host is None and not (host in ("localhost", socket.gethostname()) or loopback(host)):
            is_host = hosts = hosts and not accepts(host, port)
    ifname = own.get(mine or "")
    gloo = (("GLOO_SOCKET_IFNAME", ifname),) if ifname and "GLOO_SOCKET_IFNAME" not in os.environ else ()
    return Addressing(local_addr=given_local_addr or mine, is_host=is_host, hosts_store=hosts, env=gloo)


def host_view(endpoint: str | None = None) -> tuple[str, tuple[str, ...], dict[str, str], str | None]:
    """(hostname, its addresses, this host's addresses -> interface, the address a job of several nodes
    advertises toward ``endpoint``), for the doctor."""
    own = own_addresses()
    route = route_address(endpoint, 0) if endpoint else None
    return (
        socket.gethostname(),
        resolve(socket.gethostname(), flag=None, timeout=5.0),
        own,
        choose(multi_node=True, endpoint=endpoint or "", endpoint_addrs=(), own=own, route=route),
    )

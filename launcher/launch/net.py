"""Network look-ups with a deadline: a name that does not resolve must not stall a launch."""

from __future__ import annotations

import socket
import threading

from ..errors import UsageError

RESOLVE_TIMEOUT_S = 10.0
"""getaddrinfo has no timeout of its own; a resolver that does not answer is given this long."""


def resolve(host: str, *, flag: str, timeout: float = RESOLVE_TIMEOUT_S) -> str:
    """The first address of ``host``; one-line :class:`UsageError` when it does not resolve in time."""
    result: list[object] = []

    def look_up() -> None:
        try:
            result.append(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
        except (OSError, UnicodeError) as e:
            result.append(e)

    t = threading.Thread(target=look_up, name="numarun-resolve", daemon=True)
    t.start()
    t.join(timeout)
    if not result:
        raise UsageError(
            f"bad {flag} {host!r}: the name did not resolve within "
            f"{timeout:.0f} s; expected a host name or address of this machine"
        )
    if isinstance(result[0], BaseException):
        why = getattr(result[0], "strerror", None) or str(result[0])
        raise UsageError(f"bad {flag} {host!r}: {why}; expected a host name or address that resolves")
    return str(result[0])


def route_address(host: str, port: int) -> str | None:
    """The address of this machine's interface that reaches ``host`` (no packet is sent); None when
    there is no route or ``host`` does not resolve."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except (OSError, UnicodeError, IndexError):
        return None


def resolves(host: str, *, timeout: float = 2.0) -> bool:
    """Whether ``host`` resolves within ``timeout`` seconds."""
    try:
        resolve(host, flag="host", timeout=timeout)
    except UsageError:
        return False
    return True

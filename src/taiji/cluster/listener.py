"""The job store's listening socket, bound before the store itself exists (no torch).

A TCPStore binds every interface whatever host it is given, and it has no authentication, so
taiji binds the socket on the launcher's address itself and hands its descriptor to the store
(``store.host_store``). Binding first also lets ``taiji run`` start its first workers with the
store's port while it is still importing torch to serve the store: a client's connection waits in
the socket's backlog until the store accepts it.
"""

from __future__ import annotations

import socket

from ..errors import StoreError


def store_listener(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), for the job store."""
    try:
        return socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=1024
        )
    except OSError as exc:
        raise StoreError(f"cannot start the job store on {host}:{port}: {exc}") from exc

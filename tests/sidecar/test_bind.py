"""The sidecar's listening sockets say they are TCP, so asyncio turns Nagle off.

asyncio sets TCP_NODELAY on accepted connections only when the listening
socket's ``proto`` is IPPROTO_TCP; ``socket.create_server`` leaves it 0, and
then every response waited ~40 ms for a delayed ACK (found by bench/sidecar.py).

Python only (it calls the Python sidecar's ``bind``): Go's net package sets
TCP_NODELAY on every TCP connection by default; for both implementations
``bench/sidecar.py`` reports the HTTP latencies that would show the 40 ms.
"""

from __future__ import annotations

import socket

from joblease.sidecar.serve import bind


def test_listening_socket_is_explicitly_tcp_and_accepts_with_nodelay() -> None:
    server = bind("127.0.0.1", 0)
    try:
        assert server.proto == socket.IPPROTO_TCP
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        assert conn.proto == socket.IPPROTO_TCP
        conn.close()
        client.close()
    finally:
        server.close()

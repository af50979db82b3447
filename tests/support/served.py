"""An ASGI app served by real uvicorn on a free loopback port, in a thread.

A thread, not the test's event loop, so a test can block its loop (or run
synchronous clients) while the server keeps answering.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from joblease.embedded import free_port


class Served:
    """An ASGI app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # timeout_keep_alive: uvicorn closes an idle connection after 5 s, httpx keeps
        # one pooled for 5 s: a request sent on it as the server closes it fails with
        # "Server disconnected without sending a response" (a flake under load).
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", backlog=512, timeout_keep_alive=300)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)  # polling interval under a deadline
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

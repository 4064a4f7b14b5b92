"""Run an ASGI app (FastAPI) with uvicorn, hardened against slow and abusive clients.

Used by ``serve-prm``, ``serve-mock``, the search (the TMDB mock of RestBench runs), tests and
benchmarks. Loopback by default; ``serve_in_background`` stops the server when its ``with`` block
ends.

Guards (``uvicorn_config``): a connection must finish its request line and headers within
``header_timeout_s`` (a slow-loris client that trickles headers, or opens sockets and sends
nothing, is closed; uvicorn alone only times out idle *kept-alive* connections), headers are
capped at 64 KB, and at most ``limit_concurrency`` connections/requests are served at once (the
rest get 503). Reading the body within a deadline is the app's job (``read_body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from codetool import CodetoolError

HEADER_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 65_536


def _guarded_h11_protocol(header_timeout_s: float):
    """uvicorn's h11 protocol that closes a connection whose request headers do not arrive in time."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineH11Protocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            # Reuse the keep-alive timer: cancelled when a whole request head arrives, and its
            # handler closes the connection otherwise.
            self.timeout_keep_alive_task = self.loop.call_later(header_timeout_s, self.timeout_keep_alive_handler)

    return HeaderDeadlineH11Protocol


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 0, *, lifespan: str = "auto",
                   header_timeout_s: float = HEADER_TIMEOUT_S, limit_concurrency: int = 1000):
    """The ``uvicorn.Config`` every codetool server uses (see the module docstring for the guards)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                          timeout_keep_alive=5, http=_guarded_h11_protocol(header_timeout_s),
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, limit_concurrency=limit_concurrency)


def serve_forever(app, host: str, port: int, **kwargs) -> None:
    """Serve ``app`` in this thread until interrupted (the CLI servers)."""
    import uvicorn

    uvicorn.Server(uvicorn_config(app, host, port, **kwargs)).run()


async def read_body(request, timeout_s: float) -> bytes:
    """The request body, or ``TimeoutError`` if the client has not sent it all within ``timeout_s``."""
    return await asyncio.wait_for(request.body(), timeout_s)


@contextlib.contextmanager
def serve_in_background(app, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = 30.0,
                        lifespan: str = "auto", name: str = "codetool-server",
                        header_timeout_s: float = HEADER_TIMEOUT_S):
    """Serve ``app`` in a daemon thread; yields its base URL, e.g. ``http://127.0.0.1:43817``.

    Args:
        port (`int`, *optional*, defaults to `0`): 0 picks a free port.
        start_timeout_s (`float`, *optional*): how long to wait for the server to listen.
        lifespan (`str`, *optional*, defaults to `"auto"`): uvicorn's lifespan mode (``off`` for apps
            without start-up hooks).
        header_timeout_s (`float`, *optional*, defaults to 10): close connections whose request head
            has not arrived by then.
    Raises:
        CodetoolError: the server did not start in time (the port is taken, or the app failed).
    """
    import uvicorn

    server = uvicorn.Server(uvicorn_config(app, host, port, lifespan=lifespan, header_timeout_s=header_timeout_s))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise CodetoolError(f"{name} did not start on {host}:{port} within {start_timeout_s:g} s "
                                "(is the port taken?).")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)

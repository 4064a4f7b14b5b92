"""Run an ASGI app (FastAPI) with uvicorn in a background thread of this process.

Used by the search to start the TMDB mock for RestBench runs, and by tests and benchmarks of the
PRM and mock servers. Loopback by default; the server stops when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import threading
import time

from codetool import CodetoolError


@contextlib.contextmanager
def serve_in_background(app, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = 30.0,
                        lifespan: str = "auto", name: str = "codetool-server"):
    """Serve ``app`` in a daemon thread; yields its base URL, e.g. ``http://127.0.0.1:43817``.

    Args:
        port (`int`, *optional*, defaults to `0`): 0 picks a free port.
        start_timeout_s (`float`, *optional*): how long to wait for the server to listen.
        lifespan (`str`, *optional*, defaults to `"auto"`): uvicorn's lifespan mode (``off`` for apps
            without start-up hooks).
    Raises:
        CodetoolError: the server did not start in time (the port is taken, or the app failed).
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                                           timeout_keep_alive=5))
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

"""A TCP proxy the test owns, to cut a network the way real networks fail: silently.

``blackhole()`` stops forwarding on every connection open at that moment, for good,
and on every connection opened while it lasts, without closing any of them: the
peers see a connection that is up and never answers (a half-open connection, a
firewall dropping packets), not a refusal. ``restore()`` lets connections opened
afterwards through; the blackholed ones stay hung until their client gives up.

``retarget(host, port)`` is a failover's move of the traffic (a proxy switching its
backend, a virtual IP moving): connections opened afterwards go to the new server,
and every connection open at that moment is closed at both ends, hung ones included.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from harness.services import free_port


class BlackholeProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="blackhole-proxy", daemon=True)
        self._holes = False
        self._live: list[asyncio.Event] = []   # one "forward" switch per connection
        self._open: dict[tuple[asyncio.StreamWriter, asyncio.StreamWriter], asyncio.Task] = {}   # (client, server)
        self._server: asyncio.AbstractServer | None = None
        self.connections = 0

    def start(self) -> BlackholeProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def blackhole(self) -> None:
        def cut():
            self._holes = True
            for switch in self._live:
                switch.clear()
        self._loop.call_soon_threadsafe(cut)

    def restore(self) -> None:
        def heal():
            self._holes = False
            self._live.clear()          # the cut connections stay cut
        self._loop.call_soon_threadsafe(heal)

    def retarget(self, host: str, port: int) -> None:
        """From now on forward to ``host:port``; close every connection open now (returns once
        they are closed). A blackhole in force ends: the new server answers."""
        async def move():
            self.target = (host, port)
            self._holes = False
            self._live.clear()
            for ends, task in list(self._open.items()):
                for writer in ends:
                    writer.transport.abort()
                task.cancel()           # a blackholed one would hold its bytes for ever
        asyncio.run_coroutine_threadsafe(move(), self._loop).result(10)

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        switch = asyncio.Event()
        if not self._holes:
            switch.set()
            self._live.append(switch)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        ends = (client_w, server_w)
        self._open[ends] = asyncio.current_task()
        pumps = [asyncio.ensure_future(self._pump(client_r, server_w, switch)),
                 asyncio.ensure_future(self._pump(server_r, client_w, switch))]
        try:
            # One side gone (closed or reset: a broker SIGKILLed) ends the other, as a real network
            # that still carries packets would tell the client; a blackholed connection stays hung.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if switch.is_set():
                for pump in pumps:
                    pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._open.pop(ends, None)
            for pump in pumps:
                pump.cancel()
            for writer in ends:
                writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, switch: asyncio.Event) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await switch.wait()            # a blackholed connection holds its bytes for ever
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        if switch.is_set():
            writer.close()


@contextmanager
def proxied_database(url: str) -> Iterator[tuple[BlackholeProxy, str]]:
    """A proxy in front of the database of ``url`` (``mysql+aiomysql://...``), and the URL through it."""
    parts = urlsplit(url)
    proxy = BlackholeProxy(parts.hostname, parts.port or 3306).start()
    netloc = parts.netloc.replace(f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname,
                                  f"127.0.0.1:{proxy.port}")
    try:
        yield proxy, parts._replace(netloc=netloc).geturl()
    finally:
        proxy.stop()

"""A TCP proxy the test owns, to cut a network the way real networks fail: silently.

``blackhole()`` stops forwarding on every connection open at that moment, for good,
and on every connection opened while it lasts, without closing any of them: the
peers see a connection that is up and never answers (a half-open connection, a
firewall dropping packets), not a refusal. ``restore()`` lets connections opened
afterwards through; the blackholed ones stay hung until their client gives up.

``delay(seconds)`` holds every answer of the server that long before the client gets it (0: none),
on every connection, open or new: a slow network, or a database that is slow at everything (each
round trip takes that much longer; the connections stay up). ``slow_commits(seconds)`` holds only
the answers to ``COMMIT`` (MySQL's protocol: a ``COM_QUERY`` packet whose text is ``COMMIT``): a
database whose commits are slow (a disk that takes seconds to flush its log, a replica that must
acknowledge first) while its reads and the connections' set-up stay quick.

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
        self.latency = 0.0                     # seconds every answer of the server is held
        self.commit_latency = 0.0              # seconds the answer to a COMMIT is held

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

    def delay(self, seconds: float) -> None:
        """Hold every answer of the server ``seconds`` before it goes on (0: no more)."""
        def slow():
            self.latency = seconds
        self._loop.call_soon_threadsafe(slow)

    def slow_commits(self, seconds: float) -> None:
        """Hold the server's answer to every ``COMMIT`` ``seconds`` before it goes on (0: no more)."""
        def slow():
            self.commit_latency = seconds
        self._loop.call_soon_threadsafe(slow)

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
        commits: list[float] = []       # this connection's COMMITs asked: the latency each answer is held
        pumps = [asyncio.ensure_future(self._pump(client_r, server_w, switch, asked=self._commits_asked(commits))),
                 asyncio.ensure_future(self._pump(server_r, client_w, switch, self._answer_latency(commits)))]
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

    def _commits_asked(self, commits: list[float]):
        def asked(data: bytes) -> None:
            # A client's packet: 3 bytes of length, 1 of sequence, then the command (0x03: a query).
            if self.commit_latency and data[4:11].upper() == b"\x03COMMIT":
                commits.append(self.commit_latency)
        return asked

    def _answer_latency(self, commits: list[float]):
        def latency() -> float:
            return self.latency + (commits.pop(0) if commits else 0.0)
        return latency

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, switch: asyncio.Event,
                    latency=lambda: 0.0, asked=lambda data: None) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                asked(data)
                if held := latency():
                    await asyncio.sleep(held)      # a slow server: its answer comes that much later
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

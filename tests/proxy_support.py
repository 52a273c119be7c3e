"""Helpers for the proxy lifecycle tests: one more write proxy process joined to a
running cluster (stopped by pid by the caller), and a TCP forwarder to ZooKeeper that
holds every connection until it is opened (a proxy that is slow to start)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from subprocess import Popen

import aiohttp

from ops.cluster import procs
from tests.waiting import wait_for

# A write proxy process prints its ready line within seconds; a loaded machine gets room.
PROXY_READY_TIMEOUT_S = 60.0
# Session of the extra proxies: how long a crashed one keeps its registration.
SESSION_TIMEOUT_MS = 4_000
# Bytes copied per read by the forwarder (ZooKeeper packets are small).
FORWARD_CHUNK_BYTES = 64 * 1024


def spawn_write_proxy(
    zk: str, root: str, log_path: Path, *, proxy_id: str, port: int, extra: Sequence[str] = ()
) -> Popen[bytes]:
    """Start ``bookline writeproxy`` (its own process group; stop it with procs.stop)."""
    argv = [
        sys.executable, "-m", "ops.cli", "writeproxy", "--proxy-id", proxy_id,
        "--port", str(port), "--zk", zk, "--root", root,
        "--session-timeout-ms", str(SESSION_TIMEOUT_MS), *extra,
    ]  # fmt: skip
    return procs.spawn(argv, log_path=log_path, cwd=Path.cwd())


def log_tail(log_path: Path, offset: int = 0) -> str:
    data = log_path.read_bytes()[offset:] if log_path.exists() else b""
    return data.decode(errors="replace")[-3000:]


async def wait_ready(
    proc: Popen[bytes], log_path: Path, offset: int = 0, timeout_s: float = PROXY_READY_TIMEOUT_S
) -> None:
    """Wait for ``writeproxy ready`` after ``offset`` in the log; RuntimeError with the
    log's tail if the process exits first."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(
                f"write proxy exited with {proc.returncode}:\n{log_tail(log_path, offset)}"
            )
        return b"ready id=" in (log_path.read_bytes()[offset:] if log_path.exists() else b"")

    await wait_for(
        ready, lambda: f"write proxy ready:\n{log_tail(log_path, offset)}", timeout_s=timeout_s
    )


async def wait_listening(url: str, timeout_s: float = PROXY_READY_TIMEOUT_S) -> None:
    """Wait until ``url`` answers HTTP at all (any status)."""
    async with aiohttp.ClientSession() as session:

        async def answers() -> bool:
            try:
                async with session.get(f"{url}/health") as resp:
                    await resp.read()
                    return True
            except aiohttp.ClientError:
                return False

        await wait_for(answers, f"{url} to answer HTTP", timeout_s=timeout_s)


async def stop(proc: Popen[bytes]) -> None:
    """procs.stop off the event loop (the loop may be forwarding the proxy's traffic)."""
    await asyncio.to_thread(procs.stop, proc)


class GatedForwarder:
    """Listens on a loopback port and forwards to ``target_port``, but holds every
    connection until :meth:`open`: a proxy pointed at it cannot reach ZooKeeper yet."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._gate = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._closing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> GatedForwarder:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def open(self) -> None:
        self._gate.set()

    async def close(self) -> None:
        """Stop listening and end every connection (held ones return at once)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        self._gate.set()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self._gate.wait()
            if self._closing:
                return
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return
            try:
                await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
            finally:
                up_w.close()
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await src.read(FORWARD_CHUNK_BYTES):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError):
        dst.close()

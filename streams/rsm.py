"""A replicated key-value store on one log stream: the core library's RSM example.

Every node tails the stream and applies the commands it reads, in log order, to its
own dictionary; the log *is* the state. The node that holds the stream's writer lock
is the leader: it appends the commands clients send it and answers once it has applied
them itself. Other nodes redirect clients to it (by node id).

* **Takeover.** Every follower keeps trying to open the writer. When the leader dies
  its ZooKeeper session expires, one follower gets the lock, and opening the writer
  recovers the leader's last segment -- fencing it at the bookies, so a leader that
  was only paused can never append again -- and starts a new segment.
* **Exactly once.** A command carries ``(client, seq)``; a node applies it only if
  ``seq`` is past the last one applied for that client, so a client retrying a command
  whose answer it lost (say, because the leader died) never applies it twice.
* **Bounded log.** Each node writes a snapshot (state, per-client seqs, and the DLSN
  after the last applied command) every ``snapshot_every`` commands into a shared
  directory; the leader truncates the log before the *oldest* node's snapshot, so no
  replica ever needs what was deleted. A new node starts from the newest snapshot.

Run a node: ``python -m streams.rsm --cluster DIR/cluster.json --stream kv
--node-id n1 --port 7001 --dir SHARED``. Line protocol on TCP::

    PUT <client> <seq> <key> <value>   ->  OK <dlsn> | REDIRECT <node-id|-> | ERR <why>
    GET <key>                          ->  VALUE <value> | NONE
    STATE                              ->  <json: leader, applied, position>

Each node also appends every command it applies to ``<dir>/<node-id>.applied``
(``client seq key value``), which the tests compare across replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from foundation.errors import (
    AlreadyExistsError,
    BooklineError,
    LockOwnedError,
    NotFoundError,
    TruncatedError,
)
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, StartPosition
from streams.namespace import Namespace
from streams.reader import LogReader
from streams.records import LogRecord, ReadRecord
from streams.writer import LogWriter

log = logging.getLogger(__name__)

__all__ = ["KVNode"]

# A client's line is a command, not a document.
LINE_BYTES_MAX = 64 << 10
# How long a follower waits on the lock per attempt (it re-checks its own state between).
LEADER_ATTEMPT_S = 1.0
# A follower whose reader failed opens a new one at its position after this long.
REOPEN_DELAY_S = 0.5


class KVNode:
    def __init__(
        self, ns: Namespace, stream: str, node_id: str, directory: Path, snapshot_every: int = 100
    ) -> None:
        self.ns = ns
        self.stream = stream
        self.node_id = node_id
        self.dir = directory
        self.snapshot_every = snapshot_every
        self.state: dict[str, str] = {}
        self.client_seq: dict[str, int] = {}
        self.position = DLSN(1, 0, 0)  # next record to apply
        self.applied = 0
        self.writer: LogWriter | None = None
        self._reader: LogReader | None = None
        self._waiters: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._applied_file = open(directory / f"{node_id}.applied", "a", buffering=1)  # noqa: SIM115
        self._tasks: list[asyncio.Task[None]] = []

    # -- snapshots ---------------------------------------------------------------------

    def _snapshot_path(self, node_id: str) -> Path:
        return self.dir / f"{node_id}.snapshot.json"

    def _load_newest_snapshot(self) -> None:
        best: dict[str, Any] | None = None
        for path in self.dir.glob("*.snapshot.json"):
            snap = json.loads(path.read_text())
            if best is None or DLSN(*snap["position"]) > DLSN(*best["position"]):
                best = snap
        if best is not None:
            self.state = dict(best["state"])
            self.client_seq = {k: int(v) for k, v in best["client_seq"].items()}
            self.position = DLSN(*best["position"])
            log.info("%s: loaded snapshot at %s", self.node_id, self.position)

    def _write_snapshot(self) -> None:
        body = {"state": self.state, "client_seq": self.client_seq, "position": list(self.position)}
        path = self._snapshot_path(self.node_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)

    def _oldest_snapshot(self) -> DLSN | None:
        positions = [
            DLSN(*json.loads(p.read_text())["position"]) for p in self.dir.glob("*.snapshot.json")
        ]
        return min(positions) if positions else None

    # -- applying ----------------------------------------------------------------------

    def _apply(self, rec: ReadRecord) -> None:
        cmd = json.loads(rec.payload or b"")
        client, seq = cmd["client"], int(cmd["seq"])
        if seq > self.client_seq.get(client, -1):
            self.client_seq[client] = seq
            self.state[cmd["key"]] = cmd["value"]
            self._applied_file.write(f"{client} {seq} {cmd['key']} {cmd['value']}\n")
        self.position = rec.dlsn.next_slot()
        self.applied += 1
        waiter = self._waiters.pop((client, seq), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _apply_loop(self) -> None:
        while True:
            try:
                self._reader = await self.ns.open_reader(
                    self.stream, StartPosition.dlsn(self.position)
                )
                async for rec in self._reader:
                    self._apply(rec)
                    if self.applied % self.snapshot_every == 0:
                        await self._snapshot_and_truncate()
            except TruncatedError:
                log.warning(
                    "%s fell behind the log's truncation; reloading a snapshot", self.node_id
                )
                self._load_newest_snapshot()
            except BooklineError as exc:  # a read that failed (bookies, ZooKeeper): reopen
                log.warning(
                    "%s: reading the log failed (%s: %s); reopening at %s in %.1f s",
                    self.node_id, exc.name, exc, self.position, REOPEN_DELAY_S,
                )  # fmt: skip
                await asyncio.sleep(REOPEN_DELAY_S)
            finally:
                if self._reader is not None:
                    await self._reader.close()

    async def _snapshot_and_truncate(self) -> None:
        self._write_snapshot()
        oldest = self._oldest_snapshot()
        if self.writer is not None and oldest is not None:
            await self.writer.truncate(oldest)

    # -- leadership --------------------------------------------------------------------

    async def _leader_loop(self) -> None:
        while self.writer is None:
            try:
                self.writer = await self.ns.open_writer(
                    self.stream, self.node_id, lock_timeout_s=LEADER_ATTEMPT_S
                )
                log.info("%s is the leader (segment %d)", self.node_id, self.writer.segment_seqno)
            except LockOwnedError:
                continue
            except NotFoundError:
                # Every node creates the stream at start; one that got there while
                # another was creating it finds it missing for a moment.
                log.info("%s: stream %s not there yet; trying again", self.node_id, self.stream)
                await asyncio.sleep(REOPEN_DELAY_S)

    async def leader(self) -> str | None:
        if self.writer is not None:
            return self.node_id
        lock = self.ns.context.md.stream_lock(self.ns.name, self.stream, self.node_id)
        return await lock.owner()

    async def put(self, client: str, seq: int, key: str, value: str) -> DLSN:
        """Append a command and wait until this node applied it (exactly once)."""
        if self.writer is None:
            raise LockOwnedError("not the leader", owner=await self.leader())
        if seq <= self.client_seq.get(client, -1):
            return self.position  # applied before (a retry): answer, do not append
        done = self._waiters.setdefault((client, seq), asyncio.get_running_loop().create_future())
        body = {"client": client, "seq": seq, "key": key, "value": value}
        dlsn = await self.writer.write(LogRecord(json.dumps(body).encode()))
        await done
        return dlsn

    # -- serving -----------------------------------------------------------------------

    async def start(self) -> None:
        self._load_newest_snapshot()
        self._tasks = [
            asyncio.create_task(self._apply_loop()),
            asyncio.create_task(self._leader_loop()),
        ]

    async def handle(self, line: str) -> str:
        parts = line.split()
        try:
            if parts[:1] == ["PUT"] and len(parts) == 5:
                dlsn = await self.put(parts[1], int(parts[2]), parts[3], parts[4])
                return f"OK {dlsn}"
            if parts[:1] == ["GET"] and len(parts) == 2:
                value = self.state.get(parts[1])
                return "NONE" if value is None else f"VALUE {value}"
            if parts[:1] == ["STATE"]:
                return json.dumps({"leader": self.writer is not None, "applied": self.applied,
                                   "position": str(self.position)})  # fmt: skip
            return "ERR bad command"
        except LockOwnedError as exc:
            return f"REDIRECT {exc.owner or '-'}"
        except BooklineError as exc:
            return f"ERR {exc.name}"

    async def serve(self, port: int) -> None:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while line := await reader.readline():
                    if len(line) > LINE_BYTES_MAX:
                        break
                    writer.write((await self.handle(line.decode().strip()) + "\n").encode())
                    await writer.drain()
            except ConnectionError as exc:
                log.debug("client went away: %s", exc)
            finally:
                writer.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", port, limit=LINE_BYTES_MAX)
        print(f"READY {self.node_id} {port}", flush=True)
        async with server:
            await asyncio.gather(server.serve_forever(), *self._tasks)


async def _main(args: argparse.Namespace) -> None:
    cfg = NamespaceConfig(session_timeout_ms=args.session_timeout_ms)
    ns = await Namespace.from_cluster_file(args.cluster, args.namespace, cfg)
    with contextlib.suppress(AlreadyExistsError):  # another node made it
        await ns.create_stream(args.stream)
    node = KVNode(ns, args.stream, args.node_id, Path(args.dir), args.snapshot_every)
    await node.start()
    await node.serve(args.port)


def main() -> None:
    p = argparse.ArgumentParser(description="a replicated KV node on a Bookline stream")
    p.add_argument("--cluster", required=True, help="cluster.json of the cluster")
    p.add_argument("--namespace", default="rsm")
    p.add_argument("--stream", default="kv")
    p.add_argument("--node-id", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", required=True, help="shared directory for snapshots")
    p.add_argument("--snapshot-every", type=int, default=100)
    p.add_argument("--session-timeout-ms", type=int, default=2000)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()

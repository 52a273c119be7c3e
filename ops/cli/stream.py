"""``bookline stream ...``: stream commands through the proxies (the thin client).

``--cluster DIR/cluster.json`` (or ``BOOKLINE_CLUSTER``) says where the proxies are.

* ``create|list|describe|delete NAME`` -- via a write proxy; ``list`` leaves out the
  streams Bookline makes for topics and groups (``t~p``, ``g~group``) unless ``--all``;
  ``describe`` adds each segment's ledger quorums and ensembles (from ZooKeeper);
  readable tables, or JSON with ``--json``;
* ``write NAME [--json]`` -- one record per stdin line, through the write proxy (a
  stream that does not exist is created, said on stderr); prints the last DLSN; exits
  1 if a write was refused, 6 if a write's outcome is unknown (retries ran out);
* ``read NAME [--from earliest|latest|DLSN|seq:N|txid:N|time:MS] [--limit N]
  [--follow] [--json]`` -- one record per line, through the read proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from foundation.errors import AlreadyExistsError, ConfigError, NotFoundError
from foundation.names import is_internal, validate_name
from ops.cli.common import (
    add_cluster_flags,
    emit,
    error_text,
    outcome_unknown,
    stop_on_signals,
    table,
    write_status,
)
from ops.cli.exit import EXIT_INTERRUPTED
from ops.cli.parser import at_least
from streams.dlsn import DLSN

if TYPE_CHECKING:
    from thinclient.client import ProxyClient, ReadPage

ENV_CLUSTER = "BOOKLINE_CLUSTER"
# Lines being written at once; more wait (the client batches them into requests).
WRITES_OUTSTANDING_MAX = 10_000
# Errors shown in full by `write` (the rest are counted).
ERRORS_SHOWN_MAX = 5
# Records asked per read page.
READ_PAGE_RECORDS = 1_000
# Long poll of `read --follow`.
FOLLOW_WAIT_MS = 10_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stream", help="create, list, describe, delete, write and read streams")
    ops = p.add_subparsers(dest="stream_op", metavar="OP", required=True)

    def add(name: str, help_text: str, with_name: bool = True) -> argparse.ArgumentParser:
        q = ops.add_parser(name, help=help_text)
        add_cluster_flags(q, json_flag=name != "read")
        if with_name:
            q.add_argument("name", help="stream name")
        q.set_defaults(handler=_run)
        return q

    add("create", "create a stream")
    ls = add("list", "list streams", with_name=False)
    ls.add_argument(
        "--all", action="store_true", help="also topic partitions (t~p) and group logs (g~group)"
    )
    add("describe", "segments (with their ledgers' ensembles), counts, positions, owner")
    add("delete", "delete a stream and its data")
    add("write", "write stdin lines as records; prints the last DLSN")
    r = add("read", "print records, one per line")
    r.add_argument(
        "--from",
        dest="start",
        default="earliest",
        help="earliest, latest, seg:entry:slot, seq:N, txid:N or time:MS",
    )
    r.add_argument("--limit", type=at_least(0), metavar="N", help="stop after N records")
    r.add_argument("--max", dest="limit", type=at_least(0), help=argparse.SUPPRESS)  # consume's
    r.add_argument("--follow", action="store_true", help="keep waiting for new records")
    r.add_argument("--json", action="store_true", help="one JSON object per record")
    r.add_argument(
        "--out", type=Path, help="write the records to this file (a progress bar on a terminal)"
    )


def _run(args: argparse.Namespace) -> int:
    if not args.cluster:
        raise ConfigError(f"say where the cluster is: --cluster DIR/cluster.json or ${ENV_CLUSTER}")
    if getattr(args, "name", None) is not None:
        validate_name(args.name, "stream name")
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace) -> int:
    from thinclient.client import ProxyClient  # aiohttp: only when a command runs

    async with ProxyClient.from_cluster_file(args.cluster) as client:
        op = args.stream_op
        if op == "create":
            await client.create_stream(args.name)
            emit({"created": args.name}, args.json, lambda _o: print(f"created {args.name}"))
        elif op == "list":
            names = [n for n in await client.list_streams() if args.all or not is_internal(n)]
            emit({"streams": names}, args.json, lambda o: print("\n".join(o["streams"])))
        elif op == "describe":
            described = await _described(client, args.name)
            await _add_ensembles(args, described)
            emit(described, args.json, _show_describe)
        elif op == "delete":
            await client.delete_stream(args.name)
            emit({"deleted": args.name}, args.json, lambda _o: print(f"deleted {args.name}"))
        elif op == "write":
            await _create_if_missing(client, args.name)
            return await _write(client, args.name, args.json)
        else:
            return await _read(client, args)
    return 0


async def _described(client: ProxyClient, name: str) -> dict[str, Any]:
    """The stream as the write proxy describes it: its StreamInfo and owner."""
    from httpapi.views import info_view

    info, owner = await asyncio.gather(client.stream_info(name), client.owner(name))
    return {**info_view(info), "owner": owner}


async def _add_ensembles(args: argparse.Namespace, described: dict[str, Any]) -> None:
    """Each segment's ledger quorums and ensembles, from the metadata (not the proxy)."""
    from ops.cli.common import open_metadata

    async with open_metadata(args) as md:
        for seg in described.get("segments", []):
            try:
                meta, _version = await md.ledgers.read(int(seg["ledger_id"]))
            except NotFoundError:
                seg["ensembles"] = []  # deleted by retention meanwhile
                continue
            seg["quorums"] = [meta.ensemble_size, meta.write_quorum, meta.ack_quorum]
            seg["ensembles"] = [
                {"first_entry_id": e.first_entry_id, "bookies": list(e.bookies)}
                for e in meta.segments
            ]


def _show_describe(d: dict[str, Any]) -> None:
    table(
        f"stream {d['name']}",
        ("what", "value"),
        [
            ("records", d.get("record_count")),
            ("bytes", d.get("size_bytes")),
            ("first / last DLSN", f"{d.get('first_dlsn')} / {d.get('last_dlsn')}"),
            ("sequence ids", f"{d.get('first_sequence_id')}..{d.get('next_sequence_id')}"),
            ("owner", d.get("owner") or "none"),
        ],
    )
    rows = []
    for seg in d.get("segments", []):
        ensembles = "; ".join(
            f"{e['first_entry_id']}..: {', '.join(e['bookies'])}" for e in seg.get("ensembles", [])
        )
        quorums = "/".join(str(q) for q in seg.get("quorums", []))
        rows.append(
            (
                seg["seqno"],
                seg["state"] + (" (truncated)" if seg.get("truncated") else ""),
                seg["ledger_id"],
                seg.get("last_entry_id"),
                seg.get("record_count"),
                seg.get("size_bytes"),
                quorums,
                ensembles,
            )
        )
    table(
        "segments",
        ("seg", "state", "ledger", "last entry", "records", "bytes", "E/Qw/Qa", "ensembles"),
        rows,
    )


async def _create_if_missing(client: ProxyClient, name: str) -> None:
    """A write to a stream that does not exist creates it, as Kafka's producers create a
    topic (auto.create.topics.enable), and says so on stderr: a mistyped name must not
    pass unnoticed."""
    try:
        await client.stream_info(name)
    except NotFoundError:
        try:
            await client.create_stream(name)
        except AlreadyExistsError:
            return  # created meanwhile by another writer
        print(f"bookline: stream {name} did not exist: created it", file=sys.stderr)


async def _write(client: ProxyClient, name: str, as_json: bool) -> int:
    """One record per stdin line. A write refused (BAD_REQUEST, TOO_LARGE...) failed; one
    whose retries ran out on a retriable error (NOT_ENOUGH_BOOKIES, TIMEOUT...) may be
    stored all the same: its outcome is unknown (exit 6), never "failed"."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(WRITES_OUTSTANDING_MAX)
    tasks: list[asyncio.Task[DLSN]] = []

    async def one(line: bytes) -> DLSN:
        try:
            return await client.write(name, line)
        finally:
            slots.release()

    while True:
        raw = await loop.run_in_executor(None, sys.stdin.buffer.readline)
        if not raw:
            break
        await slots.acquire()
        tasks.append(loop.create_task(one(raw.rstrip(b"\r\n"))))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    unknown = [e for e in errors if outcome_unknown(e)]
    failed = [e for e in errors if not outcome_unknown(e)]
    written = [r for r in results if isinstance(r, DLSN)]
    summary = {
        "written": len(written),
        "failed": len(failed),
        "unknown": len(unknown),
        "last_dlsn": str(written[-1]) if written else None,
        "errors": [error_text(e) for e in failed[:ERRORS_SHOWN_MAX]],
        "unknown_errors": [error_text(e) for e in unknown[:ERRORS_SHOWN_MAX]],
    }
    if as_json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _report_writes(summary)
    return write_status(len(failed), len(unknown))


def _report_writes(summary: dict[str, Any]) -> None:
    for text in summary["errors"]:
        print(f"bookline: write failed: {text}", file=sys.stderr)
    for text in summary["unknown_errors"]:
        print(
            f"bookline: write outcome unknown (retries ran out; it may be stored): {text}",
            file=sys.stderr,
        )
    if summary["last_dlsn"]:
        print(summary["last_dlsn"])
    print(
        f"{summary['written']} records written, {summary['failed']} failed, "
        f"{summary['unknown']} outcome unknown",
        file=sys.stderr,
    )


def _line(rec: Any, as_json: bool) -> str:
    """A record read as one line: its payload as text (a null value: empty), or JSON with
    the key, Kafka's headers as ``[name, value]`` pairs and the timestamp's type."""
    from httpapi.views import timestamp_type_name

    if not as_json:
        return "" if rec.payload is None else str(rec.payload.decode("utf-8", "replace"))
    obj: dict[str, Any] = {
        "dlsn": str(rec.dlsn),
        "seq": rec.sequence_id,
        "txid": rec.txid,
        "ts": rec.timestamp_ms,
        "ts_type": timestamp_type_name(rec.timestamp_type),
        "payload": _text(rec.payload),
    }
    if rec.key is not None:
        obj["key"] = _text(rec.key)
    if rec.headers:
        obj["headers"] = [[name, _text(value)] for name, value in rec.headers]
    return json.dumps(obj)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


async def _read(client: ProxyClient, args: argparse.Namespace) -> int:
    """Pages of records to stdout, or to ``--out FILE`` with a progress bar (a bulk
    read: the total is the stream's record count when reading from the start)."""
    from ops.progress import progress

    total = args.limit
    if args.out is not None and args.start == "earliest" and not args.follow:
        count = (await client.stream_info(args.name)).record_count
        total = count if total is None else min(total, count)
    out: TextIO = sys.stdout
    if args.out is not None:
        out = await asyncio.to_thread(args.out.open, "w", encoding="utf-8")
    position = args.start
    remaining = args.limit
    read = 0
    stop = asyncio.Event()
    stopped_by = stop_on_signals(stop) if args.follow else []
    try:
        with progress(f"read {args.name}", total=total, unit="records") as bar:
            while (remaining is None or remaining > 0) and not stop.is_set():
                want = READ_PAGE_RECORDS if remaining is None else min(remaining, READ_PAGE_RECORDS)
                page = await _unless_stopped(
                    client.read(
                        args.name, position, want, wait_ms=FOLLOW_WAIT_MS if args.follow else 0
                    ),
                    stop,
                )
                if page is None:
                    break
                text = "".join(_line(rec, args.json) + "\n" for rec in page.records)
                await asyncio.to_thread(_write_flush, out, text)
                read += len(page.records)
                bar.update(done=read)
                if remaining is not None:
                    remaining -= len(page.records)
                position = page.next
                if not page.records and not args.follow:
                    break
    finally:
        if out is not sys.stdout:
            await asyncio.to_thread(out.close)
    if args.out is not None:
        print(f"{read} records of {args.name} to {args.out}; next position {position}")
    return EXIT_INTERRUPTED if signal.SIGINT in stopped_by else 0


async def _unless_stopped(read: Awaitable[ReadPage], stop: asyncio.Event) -> ReadPage | None:
    """The page ``read`` answers, or None once ``stop`` is set: then the read is
    cancelled but not waited for, so the command's end does not hang on that
    cancellation reaching through the client's retries (under load, `read --follow`
    once went on following for minutes after Ctrl-C); closing the client ends it."""
    task = asyncio.ensure_future(read)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieved)
    return None


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A stopped read's end, whatever it is, is not an error of the command."""
    if not task.cancelled():
        task.exception()


def _write_flush(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()

"""What ``./run.sh`` shows: the cluster layout, the metadata tree, and a write and a
read through the layers that exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from metadata.zk import kazoo_digest

# Don't flood the terminal with a big metadata tree.
TREE_NODES_MAX = 60


def _tree(client: KazooClient, path: str, depth: int, lines: list[str]) -> None:
    if len(lines) >= TREE_NODES_MAX:
        return
    children = sorted(client.get_children(path))
    for child in children:
        if len(lines) >= TREE_NODES_MAX:
            lines.append("  " * depth + "...")
            return
        lines.append("  " * depth + child)
        _tree(client, f"{path.rstrip('/')}/{child}", depth + 1, lines)


def show(layout: dict[str, Any]) -> None:
    print("== cluster layout (cluster.json)")
    print(json.dumps(layout, indent=2))
    digest = layout.get("zk_digest_file")  # relative to the cluster's directory
    credentials = kazoo_digest(str(Path(layout["dir"]) / digest)) if digest else {}
    client = KazooClient(hosts=layout["zk"], timeout=10, **credentials)
    client.start(timeout=15)
    try:
        lines: list[str] = []
        _tree(client, layout["root"], 1, lines)
        print(f"== metadata under {layout['zk']}{layout['root']}")
        print(layout["root"])
        print("\n".join(lines))
    finally:
        client.stop()
        client.close()


def write_and_read(cluster_file: Path) -> None:
    """Write a few records through the write proxy, read them back through the read
    proxy, and tail one more over WebSocket: what the thin client does."""
    import asyncio

    from thinclient.client import ProxyClient

    async def run() -> None:
        async with ProxyClient.from_cluster_file(cluster_file) as client:
            stream = "demo"
            before = (
                (await client.stream_info(stream)).next_sequence_id
                if stream in (await client.list_streams())
                else 0
            )
            lines = [f"hello from run.sh #{before + i}" for i in range(3)]
            print(f"== write {len(lines)} records to stream {stream!r} via {client.route(stream)}")
            dlsns = await client.write_many(stream, lines)
            for line, dlsn in zip(lines, dlsns, strict=True):
                print(f"  {dlsn}  {line}")
            page = await client.read(stream, f"seq:{before}", limit=10)
            print(f"== read them back via the read proxy (from seq:{before})")
            for rec in page.records:
                print(f"  {rec.dlsn}  seq={rec.sequence_id}  {(rec.payload or b'').decode()}")
            tail = client.tail(stream, "latest")
            first = asyncio.ensure_future(tail.__anext__())
            await asyncio.sleep(0.5)
            dlsn = await client.write(stream, "tailed over WebSocket")
            rec = await asyncio.wait_for(first, 10)
            await tail.aclose()
            print(
                f"== tail (WebSocket) saw {(rec.payload or b'').decode()!r} at {rec.dlsn} "
                f"(written at {dlsn})"
            )

    asyncio.run(run())

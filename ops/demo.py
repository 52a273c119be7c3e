"""What ``./run.sh`` shows: the cluster layout, the metadata tree, and a write and a
read through the layers that exist."""

from __future__ import annotations

import json
from typing import Any

from kazoo.client import KazooClient

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
    client = KazooClient(hosts=layout["zk"], timeout=10)
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

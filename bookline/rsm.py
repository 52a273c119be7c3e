"""The replicated key-value store example (defined in :mod:`streams.rsm`):
``python -m bookline.rsm --cluster DIR/cluster.json --node-id n1 --port 7001 --dir D``."""

from streams.rsm import KVNode, main

__all__ = ["KVNode"]

if __name__ == "__main__":
    main()

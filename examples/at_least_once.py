"""At-least-once (the default): process a batch, then commit it.

Auto-commit commits, at the start of each ``poll``, the positions the previous polls
returned -- records the loop below has processed by then. A crash after processing but
before that commit means the next owner of the partition processes those records
again; a record is never skipped. Make processing idempotent (or accept duplicates).

    python -m examples.at_least_once --cluster .cluster/cluster.json --topic orders \\
        --group billing --produce 1000
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from examples.common import Output, ensure_topic, parse
from groups.consumer import ConsumerConfig, GroupConsumer


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse(__doc__ or "", argv)
    await ensure_topic(args.cluster, args.topic, args.partitions, args.produce)
    output = Output(args.out)
    consumer = await GroupConsumer.from_cluster_file(
        args.cluster, args.group, [args.topic],
        config=ConsumerConfig(auto_offset_reset="earliest", session_timeout_ms=3_000),
    )  # fmt: skip
    last = time.monotonic()
    try:
        while time.monotonic() - last < args.idle_exit_s:
            records = await consumer.poll(timeout_s=0.5)
            if records:
                output.process(records)  # done before the next poll commits them
                last = time.monotonic()
    finally:
        await consumer.close()  # commits what was processed, leaves the group
        output.close()


if __name__ == "__main__":
    asyncio.run(main())

"""At-most-once: commit a batch, then process it.

The batch's positions are durable in the group before any of it is processed, so a
crash in the middle loses the rest of that batch (the next owner starts after it) but
never processes a record twice. Auto-commit is off: commits happen here, explicitly.

    python -m examples.at_most_once --cluster .cluster/cluster.json --topic orders \\
        --group audit --produce 1000
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
    config = ConsumerConfig(
        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=3_000
    )
    consumer = await GroupConsumer.from_cluster_file(
        args.cluster, args.group, [args.topic], config=config
    )
    last = time.monotonic()
    try:
        while time.monotonic() - last < args.idle_exit_s:
            records = await consumer.poll(timeout_s=0.5)
            if not records:
                continue
            last = time.monotonic()
            await consumer.commit()  # the positions after this batch, durable first
            output.process(records)
    finally:
        await consumer.close()
        output.close()


if __name__ == "__main__":
    asyncio.run(main())

"""A group consumer's settings (:class:`ConsumerConfig`), Kafka's names in brackets.
Frozen and checked when made; :mod:`groups.consumer` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from foundation.config import check_bounds
from foundation.errors import ConfigError
from groups.membership import MembershipConfig
from groups.state import DEFAULT_ASSIGNOR
from groups.wire import DEFAULT_SESSION_TIMEOUT_MS

__all__ = ["OFFSET_RESETS", "VIAS", "ConsumerConfig"]

OFFSET_RESETS: Final = ("earliest", "latest", "none")
VIAS: Final = ("proxy", "core")


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A consumer's settings (Kafka's name in brackets where there is one)."""

    # Where a partition without a committed offset starts [auto.offset.reset]:
    # earliest | latest | none (raise OutOfRangeError from poll).
    auto_offset_reset: str = "latest"
    # Commit the processed positions in the background [enable.auto.commit] ...
    enable_auto_commit: bool = True
    # ... at most this often, at the start of a poll [auto.commit.interval.ms].
    auto_commit_interval_ms: int = 5_000
    # Missing heartbeats this long expires the member [session.timeout.ms].
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    # Heartbeats at most this far apart (the coordinator's interval, a third of the
    # session, when that is shorter; None: always the coordinator's)
    # [heartbeat.interval.ms]. A member learns of a rebalance at its next heartbeat,
    # so a rebalance waits for the last member giving partitions up to heartbeat: about
    # 3/4 of this with 3 such members (bench consume: p50 0.9 s at 1 s, see
    # docs/benchmarks.md). A heartbeat is one small request; Kafka's default is 3 s.
    heartbeat_interval_ms: int | None = 500
    # Heartbeats this often while a rebalance is under way (hand-offs land this fast).
    rebalance_heartbeat_ms: int = 100
    # A revocation the application does not poll for within this long is finished in
    # the background [max.poll.interval.ms].
    max_poll_interval_ms: int = 300_000
    # Static membership [group.instance.id].
    group_instance_id: str | None = None
    # range | roundrobin | cooperative-sticky [partition.assignment.strategy].
    assignor: str = DEFAULT_ASSIGNOR
    # Records one poll returns at most [max.poll.records].
    max_poll_records: int = 500
    # Records one fetch asks for (one read-proxy page, one core read_many).
    fetch_records_max: int = 2_000
    # Records buffered per partition before its fetching pauses (memory bound: this
    # times the partitions held, plus one fetch each).
    buffered_records_max: int = 10_000
    # A fetch at the end of a partition waits this long for a record [fetch.max.wait.ms].
    fetch_wait_ms: int = 500
    # A commit is retried (coordinator moving, proxy down) for this long.
    commit_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.auto_offset_reset not in OFFSET_RESETS:
            raise ConfigError(f"auto_offset_reset must be one of {', '.join(OFFSET_RESETS)}")
        positive = (
            "auto_commit_interval_ms", "max_poll_interval_ms", "max_poll_records",
            "fetch_records_max", "buffered_records_max", "fetch_wait_ms", "commit_timeout_ms",
        )  # fmt: skip
        check_bounds("consumer", self, positive=positive)
        if self.buffered_records_max < self.fetch_records_max:
            raise ConfigError("consumer.buffered_records_max must be >= fetch_records_max")

    def membership(self, group: str, topics: tuple[str, ...]) -> MembershipConfig:
        return MembershipConfig(
            group=group,
            topics=topics,
            instance_id=self.group_instance_id,
            assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            rebalance_heartbeat_ms=self.rebalance_heartbeat_ms,
        )

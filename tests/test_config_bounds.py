"""Settings' signs are checked in one place (foundation.config.check_bounds, issue 23),
and every config's error names the field that is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from bookie.config import BookieConfig
from foundation.config import MetadataConfig, check_bounds
from foundation.errors import ConfigError
from groups.consumer_config import ConsumerConfig
from ledger.autorecovery_config import AutorecoveryConfig
from ledger.config import LedgerConfig
from streams.config import NamespaceConfig
from thinclient.config import ClientConfig


class _Settings:
    size = 0
    wait = -1


def test_check_bounds_names_the_first_bad_field() -> None:
    with pytest.raises(ConfigError, match=r"^CONFIG\(\d+\): s\.size must be positive$"):
        check_bounds("s", _Settings(), positive=("size",), non_negative=("wait",))
    with pytest.raises(ConfigError, match=r"s\.wait must be >= 0"):
        check_bounds("s", _Settings(), non_negative=("wait",))
    check_bounds("s", _Settings(), non_negative=("size",))  # 0 is allowed there


@pytest.mark.parametrize(
    ("cls", "field", "value", "message"),
    [
        (BookieConfig, "journal_group_wait_ms", -1, "bookie.journal_group_wait_ms must be >= 0"),
        (BookieConfig, "gc_interval_ms", 0, "bookie.gc_interval_ms must be positive"),
        (BookieConfig, "auth_timeout_s", 0, "bookie.auth_timeout_s must be positive"),
        (LedgerConfig, "placement_avoid_ms", -1, "ledger.placement_avoid_ms must be >= 0"),
        (LedgerConfig, "add_timeout_ms", 0, "ledger.add_timeout_ms must be positive"),
        (AutorecoveryConfig, "grace_ms", -1, "autorecovery.grace_ms must be >= 0"),
        (NamespaceConfig, "flush_interval_ms", -1, "core.flush_interval_ms must be >= 0"),
        (ClientConfig, "backoff_max_ms", 0, "client.backoff_max_ms must be positive"),
        (ConsumerConfig, "fetch_wait_ms", 0, "consumer.fetch_wait_ms must be positive"),
        (MetadataConfig, "connect_timeout_ms", 0, "metadata.connect_timeout_ms must be positive"),
    ],
)
def test_each_config_names_the_bad_field(cls: Any, field: str, value: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**{field: value})

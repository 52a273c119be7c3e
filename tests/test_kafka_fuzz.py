"""Property-based fuzzing of the Kafka codec's decoders (kafkaapi/protocol): fed
anything, each returns or raises the one documented error, KafkaProtocolError with a
Kafka error code; never an IndexError, struct.error, UnicodeDecodeError, MemoryError or
a hang. ``tests/fuzz/fuzz_decoders.py`` runs the same targets (``kafka-*``) with
atheris for long runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaapi.protocol.errors import KafkaProtocolError
from tests import kafka_support as targets
from tests.waiting import scaled

FUZZ = settings(
    max_examples=int(os.environ.get("BOOKLINE_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CALL_SECONDS_MAX = 2.0  # one call on a small input taking longer is a hang

TARGETS: list[Callable[[bytes], None]] = [
    targets.fuzz_request,
    targets.fuzz_response,
    targets.fuzz_frames,
    targets.fuzz_batches,
    targets.fuzz_batch_sealed,
]


@pytest.mark.parametrize("target", TARGETS, ids=[t.__name__ for t in TARGETS])
@FUZZ
@given(data=st.binary(max_size=2048))
def test_decoders_raise_only_the_protocol_error(
    target: Callable[[bytes], None], data: bytes
) -> None:
    started = time.monotonic()
    refused: KafkaProtocolError | None = None
    try:
        target(data)
    except KafkaProtocolError as exc:
        refused = exc
    assert refused is None or refused.kafka.code > 0  # a Kafka error code to answer with
    assert time.monotonic() - started < scaled(CALL_SECONDS_MAX), "decoder took too long"

"""``write_many``'s answer, :class:`DLSNSequence`: behaves like the list it replaced.

Callers index it, slice it, compare it with lists, concatenate it with lists, take its
last element (the Spark sink) and pickle it; the writer builds it from one run per
entry instead of one DLSN per record (issue 17)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import pytest

from foundation.errors import BadRequestError
from streams.dlsn import DLSN, DLSNSequence
from streams.writer.buffer import Batch, RecordBuffer

# Three entries: two in segment 4, one in segment 5 (a roll inside one batch).
RUNS = [(4, 10, 3, 2), (4, 11, 0, 3), (5, 0, 0, 1)]
AS_LIST = [
    DLSN(4, 10, 3),
    DLSN(4, 10, 4),
    DLSN(4, 11, 0),
    DLSN(4, 11, 1),
    DLSN(4, 11, 2),
    DLSN(5, 0, 0),
]


def test_equal_to_the_list_and_iterates_to_dlsns() -> None:
    seq = DLSNSequence(RUNS)
    assert seq == AS_LIST
    assert AS_LIST == seq  # noqa: SIM300 - list.__eq__ first, then ours reflected
    assert not seq != AS_LIST  # noqa: SIM202 - __ne__ is what is tested
    assert seq == DLSNSequence(RUNS)
    assert seq != AS_LIST[:-1]
    assert seq != tuple(AS_LIST)  # like a list: not equal to a tuple
    assert list(seq) == AS_LIST
    assert all(type(d) is DLSN for d in seq)
    assert len(seq) == 6
    assert list(reversed(seq)) == AS_LIST[::-1]
    assert seq.runs == tuple(RUNS)


def test_indexing_like_a_list() -> None:
    seq = DLSNSequence(RUNS)
    for i in range(-6, 6):
        assert seq[i] == AS_LIST[i]
        assert type(seq[i]) is DLSN
    assert seq[-1].segment_seqno == 5
    with pytest.raises(IndexError):
        seq[6]
    with pytest.raises(IndexError):
        seq[-7]
    with pytest.raises(IndexError):
        DLSNSequence()[0]
    with pytest.raises(TypeError):
        seq["1"]  # type: ignore[call-overload]
    assert seq[True] == AS_LIST[1]  # operator.index, as a list


@pytest.mark.parametrize(
    "cut",
    [
        slice(None),
        slice(1, 4),
        slice(2, 5),
        slice(-3, None),
        slice(4, 2),
        slice(0, 100),
        slice(None, None, 2),
        slice(None, None, -1),
        slice(5, 0, -2),
    ],
)
def test_slicing_like_a_list(cut: slice) -> None:
    seq = DLSNSequence(RUNS)
    assert seq[cut] == AS_LIST[cut]
    assert len(seq[cut]) == len(AS_LIST[cut])


def test_search_concatenation_and_immutability() -> None:
    seq = DLSNSequence(RUNS)
    assert DLSN(4, 11, 2) in seq
    assert (4, 11, 2) in seq  # a DLSN is a tuple: so is a list's membership
    assert DLSN(4, 11, 3) not in seq
    assert "4:11:2" not in seq  # type: ignore[comparison-overlap]
    assert seq.index(DLSN(4, 11, 0)) == 2
    assert seq.count(DLSN(5, 0, 0)) == 1
    assert [DLSN(1, 0, 0)] + seq == [DLSN(1, 0, 0), *AS_LIST]  # noqa: RUF005 - + is tested
    assert seq + [DLSN(9, 0, 0)] == [*AS_LIST, DLSN(9, 0, 0)]  # noqa: RUF005
    assert seq + seq == AS_LIST + AS_LIST
    acc: list[DLSN] = []
    acc += seq
    assert acc == AS_LIST
    with pytest.raises(TypeError):
        hash(seq)
    with pytest.raises(TypeError):
        seq[0] = DLSN(0, 0, 0)  # type: ignore[index]
    assert repr(seq) == f"DLSNSequence({AS_LIST!r})"


def test_pickles_and_empty() -> None:
    seq = DLSNSequence(RUNS)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(seq, protocol))
        assert type(back) is DLSNSequence
        assert back == AS_LIST
    empty = DLSNSequence()
    assert empty == []
    assert not empty
    assert list(empty) == []
    assert DLSNSequence([(1, 0, 0, 0)]) == []  # an empty run holds nothing
    with pytest.raises(BadRequestError):
        DLSNSequence([(1, 0, 0, -2)])


def test_a_batch_over_three_entries_resolves_to_their_runs() -> None:
    """RecordBuffer.resolve appends one run per entry; the batch's future gets the
    sequence (and the offsets) once its last entry is acknowledged."""

    async def main() -> tuple[tuple[Sequence[DLSN], list[int]], DLSN]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Sequence[DLSN], list[int]]] = loop.create_future()
        batch = Batch(fut, 6, offsets=True)
        single: asyncio.Future[DLSN] = loop.create_future()
        entries = []
        for slots, (seqno, entry_id, first_offset) in zip(
            ([2], [3], [1]), [(4, 10, 100), (4, 11, 105), (5, 0, 108)], strict=True
        ):
            buf = RecordBuffer(loop.create_future())
            buf.first_offset = first_offset
            if seqno == 4 and entry_id == 10:
                buf.waiters.append(single)  # slot 0, 1, 2 taken by single writes
                buf.waiters.append(single)
                buf.waiters.append(single)
            buf.waiters.append((batch, slots[0]))
            entries.append((buf, seqno, entry_id))
        for buf, seqno, entry_id in entries:
            assert not fut.done()
            buf.resolve(seqno, entry_id)
        return fut.result(), single.result()

    (dlsns, offsets), single = asyncio.run(main())
    assert single == DLSN(4, 10, 0)
    assert type(dlsns) is DLSNSequence
    assert dlsns == AS_LIST
    assert offsets == [103, 104, 105, 106, 107, 108]

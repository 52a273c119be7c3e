"""The single writer of a log stream (:class:`LogWriter`), in four modules that import
one way (writer -> sender -> segments -> buffer):

* :mod:`streams.writer.writer` -- ``LogWriter``: open and close, the write calls
  (record size, txid and timestamp checks, backpressure), flush, truncation, the
  end-of-stream marker, retention;
* :mod:`streams.writer.sender` -- the pipe: the buffer cut into entries (adaptive
  flush), encoded and submitted in order, waiters resolved, readers' LAC kept current
  (explicit LAC, control records), the first failure failing everything;
* :mod:`streams.writer.segments` -- the segment lifecycle: recovery and fencing at
  open, rolls, seals;
* :mod:`streams.writer.buffer` -- the records of one entry-to-be and their waiters.
"""

from streams.writer.writer import LogWriter

__all__ = ["LogWriter"]

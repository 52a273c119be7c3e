"""Every znode path Bookline uses, under one configurable cluster root. Pure: no I/O.

::

    <root>/INSTANCEID                         cluster identity + layout version
    <root>/bookies/available/<bookie>         ephemeral, writable bookies
    <root>/bookies/readonly/<bookie>          ephemeral, read-only bookies
    <root>/bookies/cookies/<bookie>           identity of each bookie's disks
    <root>/ledgers/idgen                      ledger id counter (CAS, handed out in blocks)
    <root>/ledgers/L/<h4>/<h4>/<h4>/L<h4>     ledger metadata; the 16 hex digits of the id
                                              split in four so no znode has > 65536 children
    <root>/ledgers/underreplicated/<id16>     autorecovery work items
    <root>/ledgers/urlocks/<id16>             ephemeral claims on those items
    <root>/ledgers/auditor                    ephemeral: the elected autorecovery auditor
    <root>/ledgers/replicacheck               when the last full replica check finished
    <root>/ledgers/replication-disabled       present: re-replication paused by an operator
    <root>/bookies/forcedreadonly/<bookie>    present: kept read-only by an operator
    <root>/streams/<ns>                       namespace record
    <root>/streams/<ns>/<stream>              stream record (options)
        maxtxid  segments/<seqno19>  lock/<member-seq>  subscribers/<name>
    <root>/topics/<ns>/<topic>                topic record (partitions, options); its
                                              partitions are the streams <topic>~<p>
    <root>/owners/<ns>/<stream>               ephemeral: which proxy owns the stream
    <root>/proxies/<proxy>                    ephemeral: write proxy address and load

Every name from a user or a peer is checked with :func:`foundation.names.validate_name`;
stream names with :func:`~foundation.names.validate_stream_name`, which also accepts the
internal ``t~p`` (topic partitions) and ``g~group`` (group logs).
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.errors import BadRequestError, ConfigError
from foundation.names import validate_name, validate_stream_name

LAYOUT_VERSION = 1
LEDGER_ID_MAX = (1 << 63) - 1  # signed 64-bit, like BookKeeper's Java longs
SEQNO_DIGITS = 19  # fits any positive signed 64-bit sequence number, sorts as text
LOCK_PREFIX = "member-"


def _check_ledger_id(ledger_id: int) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise BadRequestError(f"ledger id must be an int, got {ledger_id!r}")
    if not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise BadRequestError(f"ledger id {ledger_id} is outside 0..2^63-1")
    return ledger_id


def ledger_id_hex(ledger_id: int) -> str:
    return f"{_check_ledger_id(ledger_id):016x}"


def ledger_id_from_hex(text: str) -> int:
    if len(text) != 16:
        raise BadRequestError(f"{text!r} is not a 16-digit hex ledger id")
    try:
        return _check_ledger_id(int(text, 16))
    except ValueError as exc:
        raise BadRequestError(f"{text!r} is not a 16-digit hex ledger id") from exc


@dataclass(frozen=True, slots=True)
class Layout:
    """Paths of one cluster. ``root`` is an absolute znode path without trailing '/'."""

    root: str

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or (self.root.endswith("/") and self.root != "/"):
            raise ConfigError(f"cluster root must be an absolute znode path, got {self.root!r}")
        for part in self.root.strip("/").split("/"):
            if part:
                validate_name(part, "cluster root component")

    def _p(self, *parts: str) -> str:
        base = "" if self.root == "/" else self.root
        return "/".join((base, *parts))

    # cluster
    @property
    def instance_id(self) -> str:
        return self._p("INSTANCEID")

    # bookies
    @property
    def bookies_available(self) -> str:
        return self._p("bookies", "available")

    @property
    def bookies_readonly(self) -> str:
        return self._p("bookies", "readonly")

    @property
    def cookies(self) -> str:
        return self._p("bookies", "cookies")

    def bookie_available(self, bookie_id: str) -> str:
        return f"{self.bookies_available}/{validate_name(bookie_id, 'bookie id')}"

    def bookie_readonly(self, bookie_id: str) -> str:
        return f"{self.bookies_readonly}/{validate_name(bookie_id, 'bookie id')}"

    def cookie(self, bookie_id: str) -> str:
        return f"{self.cookies}/{validate_name(bookie_id, 'bookie id')}"

    # ledgers
    @property
    def ledger_idgen(self) -> str:
        return self._p("ledgers", "idgen")

    @property
    def ledgers_root(self) -> str:
        return self._p("ledgers", "L")

    def ledger(self, ledger_id: int) -> str:
        h = ledger_id_hex(ledger_id)
        return f"{self.ledgers_root}/{h[0:4]}/{h[4:8]}/{h[8:12]}/L{h[12:16]}"

    def ledger_id_from_path(self, path: str) -> int:
        prefix = self.ledgers_root + "/"
        if not path.startswith(prefix):
            raise BadRequestError(f"{path!r} is not a ledger path under {self.ledgers_root}")
        parts = path[len(prefix) :].split("/")
        if len(parts) != 4 or not parts[3].startswith("L"):
            raise BadRequestError(f"{path!r} is not a ledger path")
        return ledger_id_from_hex("".join((*parts[:3], parts[3][1:])))

    @property
    def underreplicated_root(self) -> str:
        return self._p("ledgers", "underreplicated")

    def underreplicated(self, ledger_id: int) -> str:
        return f"{self.underreplicated_root}/{ledger_id_hex(ledger_id)}"

    @property
    def underreplicated_locks(self) -> str:
        return self._p("ledgers", "urlocks")

    @property
    def auditor(self) -> str:
        """Ephemeral election node of the autorecovery auditor (data: the leader's id)."""
        return self._p("ledgers", "auditor")

    @property
    def replica_check(self) -> str:
        """When the last full replica check (scrub) finished, so a new auditor keeps the
        schedule instead of starting over."""
        return self._p("ledgers", "replicacheck")

    @property
    def replication_disabled(self) -> str:
        """Present while an operator has paused re-replication (``bookline
        autorecovery disable``): workers leave the items alone, the auditor still marks."""
        return self._p("ledgers", "replication-disabled")

    def bookie_forced_readonly(self, bookie_id: str) -> str:
        """Present while an operator keeps the bookie read-only (``bookline bookie
        readonly``), whatever its disks say."""
        return f"{self._p('bookies', 'forcedreadonly')}/{validate_name(bookie_id, 'bookie id')}"

    def underreplicated_lock(self, ledger_id: int) -> str:
        return f"{self.underreplicated_locks}/{ledger_id_hex(ledger_id)}"

    # streams
    @property
    def namespaces(self) -> str:
        return self._p("streams")

    def namespace(self, ns: str) -> str:
        return f"{self.namespaces}/{validate_name(ns, 'namespace')}"

    def stream(self, ns: str, stream: str) -> str:
        return f"{self.namespace(ns)}/{validate_stream_name(stream)}"

    def max_txid(self, ns: str, stream: str) -> str:
        return f"{self.stream(ns, stream)}/maxtxid"

    def segments(self, ns: str, stream: str) -> str:
        return f"{self.stream(ns, stream)}/segments"

    def segment(self, ns: str, stream: str, seqno: int) -> str:
        return f"{self.segments(ns, stream)}/{seqno_name(seqno)}"

    def lock(self, ns: str, stream: str) -> str:
        return f"{self.stream(ns, stream)}/lock"

    def subscribers(self, ns: str, stream: str) -> str:
        return f"{self.stream(ns, stream)}/subscribers"

    def subscriber(self, ns: str, stream: str, name: str) -> str:
        return f"{self.subscribers(ns, stream)}/{validate_name(name, 'subscriber')}"

    # topics
    @property
    def topic_namespaces(self) -> str:
        return self._p("topics")

    def topics(self, ns: str) -> str:
        return f"{self.topic_namespaces}/{validate_name(ns, 'namespace')}"

    def topic(self, ns: str, topic: str) -> str:
        return f"{self.topics(ns)}/{validate_name(topic, 'topic')}"

    # serving
    @property
    def owners(self) -> str:
        return self._p("owners")

    def owner(self, ns: str, stream: str) -> str:
        ns = validate_name(ns, "namespace")
        return f"{self.owners}/{ns}/{validate_stream_name(stream)}"

    @property
    def proxies(self) -> str:
        return self._p("proxies")

    def proxy(self, proxy_id: str) -> str:
        return f"{self.proxies}/{validate_name(proxy_id, 'proxy id')}"

    def base_paths(self) -> list[str]:
        """Persistent directories created by cluster init."""
        return [
            self.bookies_available,
            self.bookies_readonly,
            self.cookies,
            self.ledgers_root,
            self.underreplicated_root,
            self.underreplicated_locks,
            self.namespaces,
            self.topic_namespaces,
            self.owners,
            self.proxies,
        ]


def seqno_name(seqno: int) -> str:
    if isinstance(seqno, bool) or not isinstance(seqno, int) or not 1 <= seqno <= LEDGER_ID_MAX:
        raise BadRequestError(f"segment sequence number must be 1..2^63-1, got {seqno!r}")
    return f"{seqno:0{SEQNO_DIGITS}d}"


def seqno_from_name(name: str) -> int:
    if len(name) != SEQNO_DIGITS or not name.isdigit():
        raise BadRequestError(f"{name!r} is not a segment sequence number")
    return int(name)

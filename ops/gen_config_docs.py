"""Write ``docs/configuration.md`` from the configuration dataclasses.

``python -m ops.gen_config_docs`` (or ``bookline config docs``) rewrites the file;
``--check`` exits 1 when it differs from what the code says. The meaning of each setting
is the comment above its field (:mod:`foundation.config_docs`); the same text is each
server flag's ``--help``. ``tests/test_config_docs.py`` compares file and code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from bookie.config import BookieConfig
from foundation.config import MetadataConfig
from foundation.config_docs import Section, render_markdown
from foundation.tls import TlsConfig
from groups.consumer_config import ConsumerConfig
from groups.producer import ProducerConfig
from ledger.autorecovery_config import AutorecoveryConfig
from ledger.config import LedgerConfig
from readproxy.config import ReadProxyConfig
from streams.config import NamespaceConfig
from thinclient.config import ClientConfig
from writeproxy.config import WriteProxyConfig

__all__ = ["SECTIONS", "render", "write"]

DOC_PATH: Final = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

# Servers first (TOML sections, environment, flags), then the libraries' settings.
SECTIONS: Final = (
    Section("bookie", BookieConfig, "BOOKLINE_BOOKIE_", "`bookline bookie` (a storage node)"),
    Section("writeproxy", WriteProxyConfig, "BOOKLINE_WRITEPROXY_", "`bookline writeproxy`"),
    Section("readproxy", ReadProxyConfig, "BOOKLINE_READPROXY_", "`bookline readproxy`"),
    Section(
        "autorecovery",
        AutorecoveryConfig,
        "BOOKLINE_AUTORECOVERY_",
        "`bookline autorecovery` (auditor + replication worker) and `bookline local`",
    ),
    Section(
        "tls",
        TlsConfig,
        "BOOKLINE_TLS_",
        "every `bookline` command (servers listen, clients dial bookies, proxies and "
        "ZooKeeper with it) and any process using `foundation.tls` (docs/security.md, TLS)",
    ),
    Section("metadata", MetadataConfig, "", "every client of ZooKeeper (`MetadataClient`)"),
    Section("core", NamespaceConfig, "", "the core library (`Namespace.open(config=...)`)"),
    Section(
        "ledger", LedgerConfig, "", "the ledger client (`NamespaceConfig.ledger`, autorecovery)"
    ),
    Section("client", ClientConfig, "", "the thin client (`ProxyClient(config=...)`)"),
    Section("producer", ProducerConfig, "", "topic producers (`TopicProducer`)"),
    Section("consumer", ConsumerConfig, "", "group consumers (`GroupConsumer`)"),
)

INTRO: Final = """
Generated from the code by `python -m ops.gen_config_docs` (do not edit by hand;
`tests/test_config_docs.py` fails when this page and the code disagree). The meaning of
each setting is the comment above its field in the settings dataclass, and the same
text is the `--help` of each server flag.

**Servers** (`bookline bookie|writeproxy|readproxy|autorecovery`) read their settings in
this order, each overriding the one before: the defaults below, the `[section]` of the
TOML file given with `--config FILE`, environment variables `BOOKLINE_<SECTION>_<FIELD>`
(e.g. `BOOKLINE_BOOKIE_JOURNAL_DIR`), then flags (`--journal-dir`). An unknown key, a
value of the wrong type or settings that contradict each other stop the server at start
with a message naming the key (exit status 4). Example: `ops/deploy/bookline.toml` (every
service's section for a three-host cluster) with one environment file per instance in
`ops/deploy/env/`; the walk-through is `docs/deployment.md`.

**Libraries** (the core library, the thin client, producers and consumers) take their
settings as a frozen dataclass built in code, e.g.
`NamespaceConfig(ensemble_size=3, write_quorum=3, ack_quorum=2)`; the same checks run
when it is made. Sizes are in bytes and durations in milliseconds unless the name says
otherwise (`_bytes`, `_ms`).
"""


def render() -> str:
    return render_markdown("Configuration reference", INTRO, SECTIONS)


def write(path: Path = DOC_PATH) -> bool:
    """Rewrite ``path``; True when it changed."""
    text = render()
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.gen_config_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--out", type=Path, default=DOC_PATH, help="where to write")
    args = parser.parse_args(argv)
    if args.check:
        stale = not args.out.exists() or args.out.read_text() != render()
        if stale:
            print(f"{args.out} is stale: run python -m ops.gen_config_docs", file=sys.stderr)
        return 1 if stale else 0
    changed = write(args.out)
    print(f"{args.out} {'written' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Running a service as a process: flags from its config dataclass, uvloop, signals.

Each config field ``foo_bar`` gets an optional flag ``--foo-bar`` whose ``--help`` is the
comment above the field (:mod:`foundation.config_docs`); a flag given on the command
line overrides the TOML file's section and the environment
(:func:`foundation.config.load_config` converts the text by the field's type).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import typing
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

from foundation.config import check_setting, load_config
from foundation.config_docs import FieldDoc, field_docs
from foundation.errors import ConfigError
from foundation.gctune import settle_heap
from foundation.logs import set_identity

log = logging.getLogger(__name__)

# A stop (SIGTERM) is given this long, under the 10 s after which ops.cluster.procs -- like most
# process managers -- SIGKILLs; the services bound their own phases well within it.
STOP_S = 8.0

T = TypeVar("T")
C = TypeVar("C", bound="ServiceConfig")


class ServiceConfig(Protocol):
    """What :func:`add_proxy_command` needs of a service's settings."""

    SECTION: ClassVar[str]

    @property
    def proxy_id(self) -> str: ...


class Service(Protocol):
    url: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def flag_help(doc: FieldDoc, section: str) -> str:
    """A flag's ``--help``: the setting's meaning (the comment above its field), its
    default and where else it can be set; ``%`` escaped for argparse."""
    default = doc.default or "none"
    if doc.expression:
        default += f" = {doc.expression}"
    text = (
        f"{doc.doc} [{doc.type_name}; default {default}; "
        f"[{section}] {doc.name}, BOOKLINE_{section.upper()}_{doc.name.upper()}]"
    )
    return text.replace("%", "%%")


def add_config_flags(
    parser: argparse.ArgumentParser, cls: type[Any], section: str, *, config_flag: bool = True
) -> None:
    """``--config FILE`` (unless ``config_flag`` is False) and one optional flag per
    field of ``cls``, ``--foo-bar`` for ``foo_bar``, whose help is the field's meaning."""
    if config_flag:
        parser.add_argument("--config", help=f"TOML file; settings from its [{section}] section")
    hints = typing.get_type_hints(cls)
    for doc in field_docs(cls):
        if doc.nested is not None:
            continue  # a nested section is set in the TOML file only
        parser.add_argument(
            "--" + doc.name.replace("_", "-"),
            dest=f"cfg_{doc.name}",
            default=None,
            type=_checked(doc.name, hints[doc.name]),
            metavar=doc.name.upper(),
            help=flag_help(doc, section),
        )


def _checked(name: str, annotation: Any) -> Callable[[str], str]:
    """An argparse ``type``: a flag's value that does not convert to the setting's type
    is a usage error (exit 2, like any bad flag), not a configuration error (exit 4,
    kept for files and the environment). The text goes on to load_config unchanged."""

    def check(text: str) -> str:
        try:
            check_setting(name, text, annotation)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    return check


def load_from_args(args: argparse.Namespace, cls: type[T], section: str) -> T:
    overrides = {
        f.name: getattr(args, f"cfg_{f.name}", None)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    }
    return load_config(
        cls,
        path=args.config,
        section=section,
        env_prefix=f"BOOKLINE_{section.upper()}_",
        overrides=overrides,
    )


def add_proxy_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    cls: type[C],
    help_text: str,
    make: Callable[[C], Service],
) -> None:
    """``bookline <cls.SECTION> [--config FILE] [--<field> ...]``: load the settings,
    run the proxy ``make`` builds until SIGTERM, printing ``<section> ready ...``."""
    section = cls.SECTION
    parser = sub.add_parser(section, help=help_text)
    add_config_flags(parser, cls, section)

    def run(args: argparse.Namespace) -> int:
        config = load_from_args(args, cls, section)
        return run_service(lambda: make(config), section, config.proxy_id)

    parser.set_defaults(handler=run)


def run_service(make: Callable[[], Service], kind: str, ident: str) -> int:
    """Start the service, print ``<kind> ready ...``, serve until SIGTERM/SIGINT."""
    set_identity(kind, ident)  # JSON log lines name the process
    try:
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(_serve(make, kind, ident))


async def _serve(make: Callable[[], Service], kind: str, ident: str) -> int:
    service = make()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = loop.create_task(stop.wait())
    starting = loop.create_task(service.start())
    try:
        # A signal during start-up (waiting for ZooKeeper, or out a previous session)
        # stops it too, instead of being noticed only once started.
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # a failed start raises here
            settle_heap()  # serving from here: keep full collections off the start-up heap
            print(f"{kind} ready id={ident} url={service.url}", flush=True)
            await stopping
        log.info("%s %s stopping", kind, ident)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.wait((starting,))  # its own clean-up ran; stop() does the rest
        await _bounded(service.stop(), STOP_S, f"{kind} stop")
    return 0


async def _bounded(aw: Awaitable[None], timeout_s: float, what: str) -> None:
    """Run ``aw`` for at most ``timeout_s``; then cancel it without waiting for its
    clean-up (which may be what hangs) and go on exiting."""
    task = asyncio.ensure_future(aw)
    done, _pending = await asyncio.wait((task,), timeout=timeout_s)
    if not done:
        log.error("%s took longer than %.0f s; exiting anyway", what, timeout_s)
        task.cancel()
        return
    task.result()

"""TLS: the ``[tls]`` settings, SSL contexts for servers and clients, and a small CA.

Every hop can run over TLS -- clients and proxies to bookies (the bookie protocol),
clients to proxies (HTTP and WebSocket), everything to ZooKeeper (its
``secureClientPort``) -- when a process's ``[tls]`` section (or ``BOOKLINE_TLS_*``)
says ``enabled``. Servers present ``cert_file``/``key_file``; clients verify the
server's certificate against ``ca_file`` (the host name or IP it dialled must be in
the certificate); with ``require_client_cert`` servers also demand a client certificate
signed by that CA (mutual TLS), and clients present theirs.

A process's settings are installed once at start (:func:`configure`, by the services'
mains from ``--config``'s ``[tls]`` and the environment); code that opens a connection
asks :func:`server_context` / :func:`client_context` unless it was handed a context
explicitly (``ClientOptions(ssl=...)``, ``ProxyClient(ssl=...)``). Contexts are built
once per process and cached: building one reads and parses the files.

:func:`make_ca` and :func:`issue` create a CA and certificates signed by it with the
``openssl`` command line (tests and ``bookline local --tls``; not a production PKI).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from foundation.config import load_config
from foundation.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "CertPaths",
    "TlsConfig",
    "client_context",
    "cluster_ssl",
    "cluster_tls",
    "configure",
    "configured",
    "current",
    "issue",
    "load_tls",
    "make_ca",
    "scheme",
    "server_context",
    "server_options",
    "zookeeper_tls",
]

ENV_PREFIX: Final = "BOOKLINE_TLS_"
SECTION: Final = "tls"
# Validity of generated certificates: long enough for any local cluster or test run.
CERT_DAYS: Final = 825
# A connection that has not finished its TLS handshake by then is closed (a silent or
# plain-text peer must not hold a server's socket for asyncio's default minute).
HANDSHAKE_TIMEOUT_S: Final = 10.0
# openssl takes well under a second per key; a hung one must not hang a test.
OPENSSL_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """One process's TLS settings (the same for every hop it serves or dials)."""

    # Use TLS: servers accept only TLS, clients dial only TLS.
    enabled: bool = False
    # PEM certificate this process presents (as a server; as a client with mutual TLS).
    cert_file: str = ""
    # PEM private key of cert_file (unencrypted; keep it readable by this user only).
    key_file: str = ""
    # PEM CA certificate(s) that peers' certificates must be signed by.
    ca_file: str = ""
    # Servers demand a client certificate signed by ca_file; clients present cert_file.
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not self.ca_file:
            raise ConfigError("tls.ca_file is required when tls.enabled is true")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tls.cert_file and tls.key_file go together")
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"tls.{name}: no such file {path!r}")


def load_tls(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> TlsConfig:
    """``[tls]`` of the TOML file at ``path`` (if any) < ``BOOKLINE_TLS_*``."""
    return load_config(
        TlsConfig, path=path, section=SECTION, env_prefix=ENV_PREFIX, environ=environ
    )


# -- the process's settings and contexts -------------------------------------------------


@dataclass(slots=True)
class _Installed:
    config: TlsConfig | None = None
    server: ssl.SSLContext | None = None
    client: ssl.SSLContext | None = None


_installed = _Installed()


def configure(config: TlsConfig) -> None:
    """Install this process's settings (contexts are rebuilt on next use)."""
    _installed.config = config
    _installed.server = None
    _installed.client = None


def current() -> TlsConfig:
    """This process's settings: installed ones, else ``BOOKLINE_TLS_*`` alone."""
    if _installed.config is None:
        _installed.config = load_tls()
    return _installed.config


@contextmanager
def configured(config: TlsConfig) -> Iterator[None]:
    """Use ``config`` within the block, then what was installed before (tests)."""
    saved = dataclasses.replace(_installed)
    configure(config)
    try:
        yield
    finally:
        _installed.config, _installed.server, _installed.client = (
            saved.config,
            saved.server,
            saved.client,
        )


def server_context() -> ssl.SSLContext | None:
    """The context servers listen with, or None when TLS is off."""
    config = current()
    if not config.enabled:
        return None
    if _installed.server is None:
        _installed.server = build_server_context(config)
    return _installed.server


def server_options() -> dict[str, Any]:
    """``create_server``'s TLS arguments (none when TLS is off: asyncio refuses a
    handshake timeout without a context)."""
    context = server_context()
    if context is None:
        return {}
    return {"ssl": context, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}


def client_context() -> ssl.SSLContext | None:
    """The context clients dial with, or None when TLS is off."""
    config = current()
    if not config.enabled:
        return None
    if _installed.client is None:
        _installed.client = build_client_context(config)
    return _installed.client


def zookeeper_tls(tls: bool | None) -> TlsConfig | None:
    """The settings to dial ZooKeeper with (``MetadataConfig.tls``; None follows
    ``[tls] enabled``), or None for plain TCP."""
    config = current()
    use = config.enabled if tls is None else tls
    if not use:
        return None
    if not config.enabled:
        raise ConfigError("metadata.tls needs the certificates of [tls] (tls.enabled)")
    return config


def cluster_tls(cluster: Mapping[str, Any]) -> TlsConfig | None:
    """The client settings a ``cluster.json`` asks for: trust its ``tls.ca_file``
    (``bookline local --tls``); None when it names none."""
    section = cluster.get("tls")
    ca_file = section.get("ca_file") if isinstance(section, dict) else None
    return TlsConfig(enabled=True, ca_file=str(ca_file)) if ca_file else None


def cluster_ssl(cluster: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The client context of :func:`cluster_tls`, or None."""
    config = cluster_tls(cluster)
    return None if config is None else build_client_context(config)


def scheme() -> str:
    """The scheme of this process's HTTP URLs: https when it serves TLS."""
    return "https" if current().enabled else "http"


def build_server_context(config: TlsConfig) -> ssl.SSLContext:
    """TLS 1.2+ server context presenting ``cert_file``; mutual TLS when asked."""
    if not config.cert_file:
        raise ConfigError("tls.cert_file and tls.key_file are required to serve TLS")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, config)
    if config.require_client_cert:
        _load_ca(ctx, config)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def build_client_context(config: TlsConfig) -> ssl.SSLContext:
    """TLS 1.2+ client context: the server's certificate must chain to ``ca_file``
    and name the host dialled; presents ``cert_file`` when one is configured."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(ctx, config)
    if config.cert_file:
        _load_chain(ctx, config)
    return ctx


def _load_chain(ctx: ssl.SSLContext, config: TlsConfig) -> None:
    try:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tls: cannot load certificate {config.cert_file!r} with key {config.key_file!r}: {exc}"
        ) from exc


def _load_ca(ctx: ssl.SSLContext, config: TlsConfig) -> None:
    try:
        ctx.load_verify_locations(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load CA file {config.ca_file!r}: {exc}") from exc


# -- a small CA (openssl command line) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class CertPaths:
    """A certificate, its key and the CA that signed it, as PEM files."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def config(self, *, require_client_cert: bool = False) -> TlsConfig:
        """Settings presenting this certificate and trusting its CA."""
        return TlsConfig(
            enabled=True,
            cert_file=str(self.cert_file),
            key_file=str(self.key_file),
            ca_file=str(self.ca_file),
            require_client_cert=require_client_cert,
        )

    def environ(self, *, require_client_cert: bool = False) -> dict[str, str]:
        """The same as ``BOOKLINE_TLS_*`` variables, for a child process."""
        config = self.config(require_client_cert=require_client_cert)
        return {
            f"{ENV_PREFIX}{f.name}".upper(): _env_value(getattr(config, f.name))
            for f in dataclasses.fields(config)
        }


def _env_value(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ConfigError("the openssl command is needed to generate certificates")
    try:
        subprocess.run([exe, *args], check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace").strip()
        raise ConfigError(f"openssl {args[0]} failed: {err}") from exc


def _new_key(path: Path) -> None:
    # P-256: fast to generate, read by Python's ssl and ZooKeeper's PEM reader alike.
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path))  # fmt: skip
    os.chmod(path, 0o600)


def make_ca(directory: Path, name: str = "Bookline CA") -> CertPaths:
    """A self-signed CA in ``directory`` (``ca.pem``, ``ca-key.pem``)."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "ca-key.pem", directory / "ca.pem"
    _new_key(key)
    _openssl(
        "req", "-x509", "-new", "-key", str(key), "-out", str(cert),
        "-days", str(CERT_DAYS), "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return CertPaths(cert_file=cert, key_file=key, ca_file=cert)


def issue(
    ca: CertPaths,
    directory: Path,
    name: str,
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
) -> CertPaths:
    """A certificate for ``name`` signed by ``ca``, valid as server and client, for
    each of ``hosts`` (DNS names or IP addresses): ``<name>.pem``, ``<name>-key.pem``."""
    if not hosts:
        raise ConfigError("a certificate needs at least one host name or address")
    directory.mkdir(parents=True, exist_ok=True)
    key, csr = directory / f"{name}-key.pem", directory / f"{name}.csr"
    cert, ext = directory / f"{name}.pem", directory / f"{name}.ext"
    _new_key(key)
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        f"subjectAltName={','.join(_san(h) for h in hosts)}\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert_file),
        "-CAkey", str(ca.key_file), "-CAcreateserial", "-out", str(cert),
        "-days", str(CERT_DAYS), "-extfile", str(ext),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    return CertPaths(cert_file=cert, key_file=key, ca_file=ca.cert_file)


def _san(host: str) -> str:
    is_ip = all(part.isdigit() for part in host.split(".")) or ":" in host
    return f"IP:{host}" if is_ip else f"DNS:{host}"

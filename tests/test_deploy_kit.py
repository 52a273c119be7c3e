"""The deployment kit (ops/deploy/, docs/deployment.md) stays true to the code.

No Docker engine and no systemd run on the development machine, so nothing here starts
a container or a unit: the files are loaded and checked instead -- the compose file is
YAML with the layout's services, every ``bookline`` command line in it and in the
units parses with the real CLI parser, every ``BOOKLINE_<SECTION>_<FIELD>`` names a
real setting, the shared TOML with each instance's environment file makes valid
settings, and the Dockerfile copies every package ``pyproject.toml`` ships. The kit is
at least as locked as ``bookline local`` (issue 21, 11): tokens on the proxies and the
bookies, TLS on every hop (ZooKeeper's secure port only), ZooKeeper digest ACLs and the
ledger secret for every process that needs them, no listener on 0.0.0.0
(tests/test_deploy_kit_live.py starts a cluster from these files on loopback and tries
ZooKeeper without credentials).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from foundation.config import load_config
from ledger.keys import SECRET_FILE_ENV
from metadata.client import DIGEST_FILE_ENV
from ops.cli.entry import build_parser
from ops.gen_config_docs import SECTIONS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "ops" / "deploy"
SERVICE_SECTIONS = ("bookie", "writeproxy", "readproxy", "autorecovery")
# Where the kit keeps the cluster's credentials (0700, files 0600, owner bookline).
CREDENTIALS = "/etc/bookline/credentials"
# What each kind of process needs besides its section: ZooKeeper's digest credentials
# for all; the ledger secret for those that open ledgers; the services' token
# (service.env) for autorecovery alone (the proxies sign their own with the token
# secret); bookies get neither, but their own identity.
DIGEST_ENV = DIGEST_FILE_ENV
LEDGER_ENV = SECRET_FILE_ENV
SERVICE_ENV_FILE = f"{CREDENTIALS}/service.env"
LEDGER_SECRET_FILE = f"{CREDENTIALS}/ledger.secret"


def identity_file(bookie_id: str) -> str:
    """Where a bookie's credential lives (make-credentials.sh issues one per bookie)."""
    return f"{CREDENTIALS}/bookies/{bookie_id}.identity"


def _cls(section: str) -> type[Any]:
    return next(s.cls for s in SECTIONS if s.name == section)


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _sep, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _check_env_key(key: str) -> None:
    """BOOKLINE_<SECTION>_<FIELD> must name a real setting of a real section (or be one
    of the variables processes without that section read)."""
    if key in (DIGEST_ENV, LEDGER_ENV):
        return
    for section in SERVICE_SECTIONS:
        prefix = f"BOOKLINE_{section.upper()}_"
        if key.startswith(prefix):
            fields = {f.name for f in dataclasses.fields(_cls(section))}
            assert key[len(prefix) :].lower() in fields, f"{key}: no such setting"
            return
    raise AssertionError(f"{key} is not a BOOKLINE_<SECTION>_<FIELD> variable")


def _parses(argv: list[str]) -> argparse.Namespace:
    """``bookline ...`` arguments parse with the real parser (no SystemExit)."""
    return build_parser().parse_args(argv)


def test_the_shared_toml_and_every_instance_file_make_valid_settings() -> None:
    toml = DEPLOY / "bookline.toml"
    sections = tomllib.loads(toml.read_text())
    assert set(sections) == {*SERVICE_SECTIONS, "tls"}
    env_files = sorted((DEPLOY / "env").glob("*.env"))
    kinds = [p.stem.rsplit("-", 1)[0] for p in env_files]
    assert kinds.count("bookie") == 4 and kinds.count("writeproxy") == 2
    assert kinds.count("readproxy") == 2
    ids = set()
    for path in env_files:
        env = _env_file(path)
        for key in env:
            _check_env_key(key)
        section = path.stem.rsplit("-", 1)[0]
        config = load_config(
            _cls(section),
            path=toml,
            section=section,
            env_prefix=f"BOOKLINE_{section.upper()}_",
            environ=env,
        )
        ident = getattr(config, "bookie_id", None) or getattr(config, "proxy_id", "")
        assert ident and ident not in ids, path
        ids.add(ident)
        if section == "bookie":
            dirs = {config.journal_dir, config.ledgers_dir, config.index_dir}
            assert len(dirs) == 3, path
            assert config.identity_file == identity_file(config.bookie_id), path
    load_config(_cls("autorecovery"), path=toml, section="autorecovery")


def test_the_layout_survives_a_lost_bookie() -> None:
    """4 bookies for ledgers of E=3: a dead bookie can be replaced at once."""
    wp = tomllib.loads((DEPLOY / "bookline.toml").read_text())["writeproxy"]
    bookies = len(list((DEPLOY / "env").glob("bookie-*.env")))
    assert wp["ensemble_size"] < bookies
    assert wp["ensemble_size"] >= wp["write_quorum"] > wp["ack_quorum"] >= 1


Unit = dict[str, dict[str, list[str]]]  # section -> key -> every value, in order


def _unit(text: str) -> Unit:
    """A systemd unit: keys may repeat (EnvironmentFile=, Environment=)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, line
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def _units() -> dict[str, Unit]:
    return {p.name: _unit(p.read_text()) for p in sorted((DEPLOY / "systemd").glob("*.service"))}


def unit_environment(unit: Unit) -> tuple[dict[str, str], list[str]]:
    """A unit's Environment= assignments and its EnvironmentFile= paths."""
    env = {}
    for assignments in unit["Service"].get("Environment", []):
        for item in shlex.split(assignments):
            key, _sep, value = item.partition("=")
            env[key] = value
    return env, unit["Service"].get("EnvironmentFile", [])


def test_systemd_units() -> None:
    units = _units()
    assert {
        "bookline-bookie@.service",
        "bookline-writeproxy@.service",
        "bookline-readproxy@.service",
        "bookline-autorecovery.service",
        "bookline-zookeeper.service",
    } <= set(units)
    for name, unit in units.items():
        for part in ("Unit", "Service", "Install"):
            assert part in unit, f"{name}: no [{part}]"
        assert unit["Service"]["Restart"] == ["on-failure"], name
        (exec_start,) = unit["Service"]["ExecStart"]
        argv = shlex.split(exec_start)
        if argv[0].endswith("/bookline"):
            args = _parses(argv[1:])
            assert args.command in SERVICE_SECTIONS, name
            assert "/etc/bookline/bookline.toml" in argv, name
        for env_file in unit_environment(unit)[1]:
            if "%i" in env_file:
                kind = name.split("@")[0].removeprefix("bookline-")
                assert (DEPLOY / "env" / f"{kind}-1.env").exists(), name


def test_zookeeper_ensemble_configs() -> None:
    for path, hosts in (
        (DEPLOY / "zookeeper" / "zoo.cfg", ("h1", "h2", "h3")),
        (DEPLOY / "docker" / "zoo.cfg", ("zk1", "zk2", "zk3")),
    ):
        text = path.read_text()
        servers = re.findall(r"^server\.(\d)=(\w+):2888:3888$", text, re.M)
        assert servers == [(str(i), h) for i, h in enumerate(hosts, 1)], path
        assert "srvr" in text  # bookline status asks each server's mode


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    return doc


def test_compose_file_has_the_layout_and_valid_commands() -> None:
    doc = _compose()
    services = doc["services"]
    expected = {f"zk{i}" for i in (1, 2, 3)} | {f"bookie{i}" for i in (1, 2, 3, 4)}
    expected |= {"writeproxy1", "writeproxy2", "readproxy1", "readproxy2"}
    assert expected <= set(services), sorted(services)
    myids = set()
    for name, svc in services.items():
        assert svc.get("image") == "bookline:latest" and "build" in svc, name
        for key in svc.get("environment") or {}:
            _check_env_key(key)
        if name.startswith("zk"):
            script = " ".join(svc["command"])
            myids.add(re.search(r"echo (\d) > /srv/zookeeper/myid", script).group(1))  # type: ignore[union-attr]
            assert "QuorumPeerMain" in script, name
            continue
        args = _parses([str(a) for a in svc["command"]])
        assert args.command in SERVICE_SECTIONS, name
        if name.startswith("bookie"):
            mounts = {v.split(":")[1] for v in svc["volumes"]} - {CREDENTIALS}
            disks = {m for m in mounts if not m.startswith(CREDENTIALS + "/")}
            assert disks == {"/srv/bookline/journal", "/srv/bookline/ledgers",
                             "/srv/bookline/index"}, name  # fmt: skip
            assert set(svc["depends_on"]) == {"zk1", "zk2", "zk3"}, name
    assert myids == {"1", "2", "3"}
    for volume in (v.split(":")[0] for s in services.values() for v in s.get("volumes", [])):
        assert volume in doc["volumes"] or volume.startswith("./credentials"), volume
    build = services["bookie1"]["build"]
    assert (DEPLOY / "docker" / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "docker" / "Dockerfile"
    )


def test_dockerfile_copies_every_package() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) \1$", text, re.M))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= copied, packages - copied
    for source in re.findall(r"^COPY (\S+) /etc/bookline/", text, re.M):
        assert (ROOT / source).exists(), source
    assert re.search(r'^ENTRYPOINT \["bookline"\]$', text, re.M)


@pytest.mark.parametrize("doc", ["deployment.md", "configuration.md"])
def test_deployment_docs_name_the_kit(doc: str) -> None:
    text = (ROOT / "docs" / doc).read_text()
    assert "ops/deploy" in text


# -- security (issue 21, 11) ---------------------------------------------------------------


def test_every_service_requires_tokens_and_tls() -> None:
    toml = tomllib.loads((DEPLOY / "bookline.toml").read_text())
    for section in ("bookie", "writeproxy", "readproxy"):
        settings = toml[section]
        assert settings["auth_enabled"] is True, section
        assert settings["auth_secret_file"].startswith(CREDENTIALS + "/"), section
        assert settings["auth_grants_file"].startswith(CREDENTIALS + "/"), section
        # ZooKeeper's secure port: the plain one does not exist (zoo.cfg below).
        assert all(h.endswith(":2281") for h in settings["zk"].split(",")), section
    tls = toml["tls"]
    assert tls["enabled"] is True
    for name in ("cert_file", "key_file", "ca_file"):
        assert tls[name].startswith(CREDENTIALS + "/tls/"), name


def test_zookeeper_serves_tls_only() -> None:
    for path in (DEPLOY / "zookeeper" / "zoo.cfg", DEPLOY / "docker" / "zoo.cfg"):
        settings = dict(
            line.split("=", 1)
            for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        )
        assert "clientPort" not in settings, path
        assert settings["secureClientPort"] == "2281", path
        assert settings["serverCnxnFactory"].endswith("NettyServerCnxnFactory"), path
        assert settings["ssl.keyStore.type"] == settings["ssl.trustStore.type"] == "PEM"
    unit = _units()["bookline-zookeeper.service"]
    assert "netty-codec.jar" in unit["Service"]["ExecStart"][0]  # TLS needs Netty's codec


def _needs(kind: str) -> set[str]:
    return {DIGEST_ENV} if kind == "bookie" else {DIGEST_ENV, LEDGER_ENV}


def test_every_unit_gets_the_credentials_it_needs() -> None:
    for name, unit in _units().items():
        if name == "bookline-zookeeper.service":
            continue
        kind = name.removeprefix("bookline-").split("@")[0].split(".")[0]
        env, env_files = unit_environment(unit)
        assert set(env) == _needs(kind), name
        assert all(v.startswith(CREDENTIALS + "/") for v in env.values()), name
        assert (SERVICE_ENV_FILE in env_files) == (kind == "autorecovery"), name
        hidden = " ".join(unit["Service"].get("InaccessiblePaths", [])).split()
        if kind == "bookie":  # same user as the host's proxies, yet never their secrets
            assert {f"-{LEDGER_SECRET_FILE}", f"-{SERVICE_ENV_FILE}"} <= set(hidden), name


def test_make_credentials_issues_every_bookie_of_the_kit_its_identity() -> None:
    """The script's default bookies are the kit's (ops/deploy/env), each issued its
    credential with `bookline auth bookie-credential` (tests/test_deploy_kit_live.py runs
    the script and the bookies prove themselves with what it made)."""
    script = (DEPLOY / "make-credentials.sh").read_text()
    found = re.search(r"^bookies=\$\{BOOKIES:-([^}]*)\}$", script, re.M)
    assert found, "make-credentials.sh: no default $BOOKIES"
    kit = {_env_file(p)["BOOKLINE_BOOKIE_BOOKIE_ID"] for p in (DEPLOY / "env").glob("bookie-*.env")}
    assert set(found.group(1).split()) == kit
    issue = re.search(r"auth bookie-credential \"\$id\".*\n.*--out \"([^\"]+)\"", script)
    assert issue and issue.group(1) == "$out/bookies/$id.identity"
    _parses(["auth", "bookie-credential", "bookie-1", "--ledger-secret-file", "f", "--out", "o"])


def test_no_listener_on_every_address() -> None:
    """Proxies on their host's own address (its environment file), autorecovery's
    /metrics too; the compose file publishes ports on the Docker host's loopback."""
    for path in sorted((DEPLOY / "env").glob("*proxy-*.env")):
        env = _env_file(path)
        kind = path.stem.rsplit("-", 1)[0].upper()
        host = env[f"BOOKLINE_{kind}_HOST"]
        assert re.fullmatch(r"h\d", host), path
        assert env[f"BOOKLINE_{kind}_ADVERTISE_URL"].startswith(f"https://{host}:"), path
    (exec_start,) = _units()["bookline-autorecovery.service"]["Service"]["ExecStart"]
    assert _parses(shlex.split(exec_start)[1:]).http_host == "%H"
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        command = [str(a) for a in svc.get("command", [])]
        if "--http-host" in command:
            assert command[command.index("--http-host") + 1] == name
        for key, value in (svc.get("environment") or {}).items():
            if key.endswith("_HOST"):
                assert value == name, (name, key)
    for path in [DEPLOY / "bookline.toml", *DEPLOY.glob("*/*")]:
        for line in path.read_text().splitlines():
            if not line.lstrip().startswith("#"):
                assert "0.0.0.0" not in line.split("#")[0], (path, line)


def test_every_compose_service_gets_the_credentials_it_needs() -> None:
    for name, svc in _compose()["services"].items():
        kind = re.sub(r"\d+$", "", name)
        if kind == "bookie":
            _check_bookie_mounts(name, svc)
        else:
            assert f"./credentials:{CREDENTIALS}:ro" in svc.get("volumes", []), name
        if name.startswith("zk"):
            continue
        env = svc.get("environment") or {}
        assert {DIGEST_ENV, LEDGER_ENV} & set(env) == _needs(kind), name
        assert ("credentials/service.env" in svc.get("env_file", [])) == (kind == "autorecovery")
    doc = json.loads((DEPLOY / "docker" / "cluster.json").read_text())
    assert doc["zk_digest_file"] and doc["ledger_secret_file"] and doc["token_file"]
    assert doc["tls"]["ca_file"].startswith(CREDENTIALS + "/tls/")
    assert all(p["url"].startswith("https://") for p in doc["write_proxies"] + doc["read_proxies"])


def _check_bookie_mounts(name: str, svc: dict[str, Any]) -> None:
    """A bookie container mounts only what it uses of the credentials, its own identity
    among them: not the ledger secret, the services' token, the CA's key, nor another
    bookie's identity (issue 21, 2)."""
    bookie_id = svc["environment"]["BOOKLINE_BOOKIE_BOOKIE_ID"]
    own = identity_file(bookie_id)
    assert svc["environment"]["BOOKLINE_BOOKIE_IDENTITY_FILE"] == own, name
    mounts = {}
    for volume in svc["volumes"]:
        source, target, *_mode = volume.split(":")
        if source.startswith("./credentials"):
            assert volume.endswith(":ro"), volume
            assert source == "./credentials" + target.removeprefix(CREDENTIALS), volume
            mounts[target] = source
    used = {f"{CREDENTIALS}/{f}" for f in ("secret", "grants.toml", "zk.digest")}
    used |= {f"{CREDENTIALS}/tls/{f}" for f in ("ca.pem", "node.pem", "node-key.pem")}
    assert set(mounts) == used | {own}, (name, sorted(mounts))

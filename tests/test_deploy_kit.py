"""The deployment kit (ops/deploy/, docs/deployment.md) stays true to the code.

No Docker engine and no systemd run on the development machine, so nothing here starts
a container or a unit: the files are loaded and checked instead -- the compose file is
YAML with the layout's services, every ``bookline`` command line in it and in the
units parses with the real CLI parser, every ``BOOKLINE_<SECTION>_<FIELD>`` names a
real setting, the shared TOML with each instance's environment file makes valid
settings, and the Dockerfile copies every package ``pyproject.toml`` ships.
"""

from __future__ import annotations

import argparse
import configparser
import dataclasses
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from foundation.config import load_config
from ops.cli import build_parser
from ops.gen_config_docs import SECTIONS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "ops" / "deploy"
SERVICE_SECTIONS = ("bookie", "writeproxy", "readproxy", "autorecovery")


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
    """BOOKLINE_<SECTION>_<FIELD> must name a real setting of a real section."""
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
    assert set(sections) == set(SERVICE_SECTIONS)
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
    load_config(_cls("autorecovery"), path=toml, section="autorecovery")


def test_the_layout_survives_a_lost_bookie() -> None:
    """4 bookies for ledgers of E=3: a dead bookie can be replaced at once."""
    wp = tomllib.loads((DEPLOY / "bookline.toml").read_text())["writeproxy"]
    bookies = len(list((DEPLOY / "env").glob("bookie-*.env")))
    assert wp["ensemble_size"] < bookies
    assert wp["ensemble_size"] >= wp["write_quorum"] > wp["ack_quorum"] >= 1


def _units() -> dict[str, configparser.ConfigParser]:
    out = {}
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        unit = configparser.ConfigParser(interpolation=None, strict=True)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read_string(path.read_text())
        out[path.name] = unit
    return out


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
            assert unit.has_section(part), f"{name}: no [{part}]"
        assert unit["Service"]["Restart"] == "on-failure", name
        argv = shlex.split(unit["Service"]["ExecStart"])
        if argv[0].endswith("/bookline"):
            args = _parses(argv[1:])
            assert args.command in SERVICE_SECTIONS, name
            assert "/etc/bookline/bookline.toml" in argv, name
        env_file = unit["Service"].get("EnvironmentFile", "")
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
            mounts = {v.split(":")[1] for v in svc["volumes"]}
            assert mounts == {"/srv/bookline/journal", "/srv/bookline/ledgers",
                              "/srv/bookline/index"}, name  # fmt: skip
            assert set(svc["depends_on"]) == {"zk1", "zk2", "zk3"}, name
    assert myids == {"1", "2", "3"}
    for volume in (v.split(":")[0] for s in services.values() for v in s.get("volumes", [])):
        assert volume in doc["volumes"], volume
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

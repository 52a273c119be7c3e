"""The configuration reference: ``--help`` of every server and ``docs/configuration.md``
say what each setting means, taken from the comments above the fields in the code
(:mod:`foundation.config_docs`), so neither can go stale."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from foundation.config_docs import field_docs
from ops.cli.entry import build_parser
from ops.gen_config_docs import SECTIONS, render

ROOT = Path(__file__).resolve().parent.parent
# The servers whose every setting is a flag (autorecovery's too).
SERVERS = ("bookie", "writeproxy", "readproxy", "autorecovery")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise AssertionError(f"no sub-command {name}")


def _section(name: str) -> type[object]:
    return next(s.cls for s in SECTIONS if s.name == name)


@pytest.mark.parametrize("command", SERVERS)
def test_every_server_flag_says_what_it_means(command: str) -> None:
    """Before: each flag's help was its key name (``bookie.journal_group_wait_ms``)."""
    sub = _subparser(build_parser(), command)
    helps = {opt: a.help or "" for a in sub._actions for opt in a.option_strings}
    for doc in field_docs(_section(command)):
        flag = "--" + doc.name.replace("_", "-")
        assert flag in helps, f"{command} has no flag {flag}"
        text = helps[flag].replace("%%", "%")
        assert doc.doc, f"{command}.{doc.name} has no comment in the code"
        assert doc.doc[:40] in text, f"{command} {flag}: {text!r}"
        assert "default" in text, f"{command} {flag}: {text!r}"
    # argparse must be able to format it (a stray % would raise here)
    assert "--config" in sub.format_help()


def test_every_documented_setting_has_a_meaning() -> None:
    for section in SECTIONS:
        for doc in field_docs(section.cls):
            assert doc.doc, f"[{section.name}] {doc.name}: no comment above the field"


def test_configuration_md_is_generated_from_the_code() -> None:
    """docs/configuration.md == what ``python -m ops.gen_config_docs`` writes now."""
    path = ROOT / "docs" / "configuration.md"
    assert path.read_text() == render(), (
        "docs/configuration.md is stale: run `.venv/bin/python -m ops.gen_config_docs`"
    )


def test_every_settings_class_is_in_the_reference() -> None:
    text = render()
    for section in SECTIONS:
        assert f"## `[{section.name}]`" in text
        for f in dataclasses.fields(section.cls):
            assert f"| `{f.name}` |" in text


def test_extractor_rules() -> None:
    """Shared comments, inline comments, headings and base-class comments."""

    @dataclasses.dataclass(frozen=True)
    class Base:
        # Port to listen on.
        port: int = 1

    @dataclasses.dataclass(frozen=True)
    class Demo(Base):
        # --- a group ----------------------------------------------------------
        # Backoff: initial, then doubling
        # up to the max.
        backoff_initial_ms: int = 20
        backoff_max_ms: int = 1 << 10

        mode: str = "x"  # "x" or "y"
        port: int = 2

    docs = {d.name: d for d in field_docs(Demo)}
    assert docs["backoff_initial_ms"].doc == "Backoff: initial, then doubling up to the max."
    assert docs["backoff_max_ms"].doc == docs["backoff_initial_ms"].doc
    assert docs["backoff_max_ms"].default == "1024"
    assert docs["backoff_max_ms"].expression == "1 << 10"
    assert docs["backoff_initial_ms"].group == "a group"
    assert docs["mode"].doc == '"x" or "y"'
    assert docs["mode"].default == '"x"'
    assert docs["port"].doc == "Port to listen on."
    assert docs["port"].default == "2"

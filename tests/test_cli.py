"""The `bookline` entry point answers --version and --help, and fails clearly."""

from __future__ import annotations

import subprocess
import sys

from bookline import __version__


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version() -> None:
    out = _run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"bookline {__version__}"


def test_help_lists_commands() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for command in ("local", "demo", "bench"):
        assert command in out.stdout


def test_unknown_command_fails() -> None:
    out = _run("no-such-command")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr

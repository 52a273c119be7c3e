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


def test_bench_machine_prints_its_yardsticks_as_json() -> None:
    """`bookline bench machine --json`: one JSON object, every probe measured (a forked
    echo child answers the round trips and is gone afterwards)."""
    import json

    out = _run("bench", "machine", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bench"] == "machine"
    for key in ("py_loop_ns", "syscall_ns", "process_rtt_p50_us", "process_rtt_p99_us"):
        assert result[key] > 0, key
    assert result["process_rtt_p99_us"] >= result["process_rtt_p50_us"]

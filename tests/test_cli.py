"""The `bookline` entry point answers --version and --help, and fails clearly."""

from __future__ import annotations

from bookline import __version__
from tests.cli_support import run_cli


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"bookline {__version__}"


def test_help_lists_commands() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("local", "demo", "bench"):
        assert command in out.stdout


def test_unknown_command_fails() -> None:
    out = run_cli("no-such-command")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_bench_machine_prints_its_yardsticks_as_json() -> None:
    """`bookline bench machine --json`: one JSON object, every probe measured (a forked
    echo child answers the round trips and is gone afterwards)."""
    import json

    out = run_cli("bench", "machine", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bench"] == "machine"
    for key in ("py_loop_ns", "syscall_ns", "process_rtt_p50_us", "process_rtt_p99_us"):
        assert result[key] > 0, key
    assert result["process_rtt_p99_us"] >= result["process_rtt_p50_us"]

"""Issue 22 (11, 12): the command line behaves the same way everywhere -- bad flags exit
2 with a short error and a "did you mean", `--help` shows defaults, errors under
`--json` are JSON, one name per flag -- and `--version` does not load the stack."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

from ops.cli.exit import EXIT_CONFIG, EXIT_USAGE
from tests.cli_support import run_cli


def test_version_and_help_do_not_import_the_stack() -> None:
    """`bookline --version` imported every command's module (kazoo included) before
    parsing: 0.84 s of CPU for a version string."""
    code = (
        "import sys, ops.cli\n"
        "for argv in (['--version'], ['--help']):\n"
        "    try:\n"
        "        ops.cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('aiohttp', 'kazoo', 'pyspark', 'rocksdict', 'asyncio', 'rich')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_command_table_matches_the_registered_commands() -> None:
    """`bookline --help` lists commands from ops.cli.COMMANDS without importing them;
    the list must be the real one, with the same help."""
    import argparse

    from ops.cli.entry import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert registered == {name: text for name, (text, _refs) in COMMANDS.items()}


def test_bad_flag_values_are_usage_errors() -> None:
    """`--port abc` exited 4 (configuration) and `topic create --partitions 0` exited 1
    after asking the cluster; README: 2 is bad flags or arguments."""
    for argv in (
        ("bookie", "--port", "abc"),
        ("writeproxy", "--port", "abc"),
        ("topic", "create", "t", "--partitions", "0", "--cluster", "/nonexistent.json"),
        ("consume", "t", "--group", "g", "--limit", "-1", "--cluster", "/nonexistent.json"),
    ):
        out = run_cli(*argv)
        assert out.returncode == EXIT_USAGE, (argv, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr


def test_an_unknown_sub_command_is_a_short_error_with_a_suggestion() -> None:
    """`bookline bookie lst` printed 40 lines of the bookie's server flags and no hint."""
    for argv, meant in ((("bookie", "lst"), "list"), (("strem", "list"), "stream")):
        out = run_cli(*argv)
        assert out.returncode == EXIT_USAGE, out.stderr
        assert f"did you mean {meant!r}?" in out.stderr, out.stderr
        assert len(out.stderr.splitlines()) <= 3, out.stderr


def test_help_shows_defaults() -> None:
    out = run_cli("stream", "read", "--help")
    assert "(default: earliest)" in " ".join(out.stdout.split()), out.stdout
    out = run_cli("autorecovery", "--help")
    assert "(default: 127.0.0.1)" in " ".join(out.stdout.split()), out.stdout


def test_errors_under_json_are_one_json_object(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothere.json")
    out = run_cli("stream", "list", "--json", "--cluster", missing)
    assert out.returncode == EXIT_CONFIG, out.stderr
    error = json.loads(out.stderr.strip().splitlines()[-1])["error"]
    assert (error["code"], error["name"]) == (14, "CONFIG")
    assert missing in error["message"]
    out = run_cli("topic", "create", "t", "--partitions", "0", "--json", "--cluster", missing)
    assert out.returncode == EXIT_USAGE
    assert json.loads(out.stderr)["error"]["name"] == "BAD_REQUEST", out.stderr


def test_consume_and_stream_read_both_say_limit() -> None:
    """`consume --max N` vs `stream read --limit N`: one name, the other a hidden alias."""
    from ops.cli.entry import build_parser

    parser = build_parser()
    for argv in (
        ["consume", "t", "--group", "g", "--limit", "3"],
        ["consume", "t", "--group", "g", "--max", "3"],
        ["stream", "read", "s", "--limit", "3"],
    ):
        assert parser.parse_args(argv).limit == 3, argv
    assert "--max" not in run_cli("consume", "--help").stdout


class _Stdin:
    def __init__(self, data: bytes) -> None:
        import io

        self.buffer = io.BytesIO(data)


class _RetriesRanOut:
    """A thin client whose every write ran out of retries on NOT_ENOUGH_BOOKIES (3
    bookies, one stopped), except the lines it is told to refuse or accept."""

    async def write(self, name: str, payload: bytes) -> object:
        from foundation.errors import NotEnoughBookiesError, TooLargeError
        from streams.dlsn import DLSN

        if payload == b"ok":
            return DLSN(1, 0, 0)
        if payload == b"big":
            raise TooLargeError("record of 2 MiB is over the limit")
        raise NotEnoughBookiesError("2 writable bookies, the ensemble needs 3")


def test_a_write_whose_retries_ran_out_has_an_unknown_outcome(
    monkeypatch: object, capsys: object
) -> None:
    """`stream write` said "write failed: NOT_ENOUGH_BOOKIES" (exit 1) for a record that
    was in the stream: after retries on a retriable error the outcome is unknown (6)."""
    import asyncio

    import pytest

    from ops.cli import stream as cli_stream
    from ops.cli.exit import EXIT_ERROR, EXIT_UNKNOWN_OUTCOME

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    assert isinstance(capsys, pytest.CaptureFixture)
    client: object = _RetriesRanOut()
    monkeypatch.setattr(sys, "stdin", _Stdin(b"ok\nlost\n"))
    status = asyncio.run(cli_stream._write(client, "s", False))  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert status == EXIT_UNKNOWN_OUTCOME, err
    assert "outcome unknown" in err and "write failed" not in err, err
    monkeypatch.setattr(sys, "stdin", _Stdin(b"ok\nlost\nbig\n"))
    status = asyncio.run(cli_stream._write(client, "s", True))  # type: ignore[arg-type]
    summary = json.loads(capsys.readouterr().out)
    assert status == EXIT_ERROR  # one was refused: that one failed for sure
    assert (summary["written"], summary["failed"], summary["unknown"]) == (1, 1, 1)


def test_produce_reports_an_unknown_outcome_apart_from_failures(capsys: object) -> None:
    import pytest

    from foundation.errors import NotEnoughBookiesError, TooLargeError
    from ops.cli.exit import EXIT_ERROR, EXIT_UNKNOWN_OUTCOME
    from ops.cli.topic import _produce_report

    assert isinstance(capsys, pytest.CaptureFixture)
    lost = NotEnoughBookiesError("2 writable bookies, the ensemble needs 3")
    assert _produce_report([(0, 7), lost], False) == EXIT_UNKNOWN_OUTCOME
    err = capsys.readouterr().err
    assert "outcome unknown" in err and "produce failed" not in err, err
    assert _produce_report([(0, 7), lost, TooLargeError("big")], True) == EXIT_ERROR
    summary = json.loads(capsys.readouterr().out)
    assert (summary["records"], summary["failed"], summary["unknown"]) == (1, 1, 1)


def test_local_gives_each_process_one_id_in_every_view(tmp_path: Path, monkeypatch: object) -> None:
    """Issue 22 (11): status listed a write proxy as `wp-1` in one table and
    `writeproxy-1` in another, and the auditor as `HOSTNAME-PID`; `bookline local`
    now passes each child's name as the id the process registers and elects with."""
    import pytest

    from ops.cluster.local import LocalCluster

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    started: dict[str, list[str]] = {}

    def spawn(self: LocalCluster, name: str, kind: str, argv: list[str], log: Path) -> object:
        started[name] = argv
        return types.SimpleNamespace(address="", extra={})

    monkeypatch.setattr(LocalCluster, "_spawn", spawn)
    monkeypatch.setattr(LocalCluster, "zk_connect", "127.0.0.1:1/t")
    cluster = LocalCluster(tmp_path, write_proxies=1, read_proxies=1, autorecovery=True)
    ports = {"writeproxy-1": 1, "readproxy-1": 2, "autorecovery-1": 3}
    cluster._start_proxy("writeproxy", 1, ports)
    cluster._start_proxy("readproxy", 1, ports)
    cluster._start_autorecovery(1, ports)
    for name, flag in (
        ("writeproxy-1", "--proxy-id"),
        ("readproxy-1", "--proxy-id"),
        ("autorecovery-1", "--id"),
    ):
        argv = started[name]
        assert argv[argv.index(flag) + 1] == name, argv
    # ... and the autorecovery command takes it.
    from ops.cli.entry import build_parser

    args = build_parser().parse_args(["autorecovery", "--id", "autorecovery-1", "--zk", "z"])
    assert args.instance_id == "autorecovery-1"


def test_token_is_refused_where_it_would_be_ignored() -> None:
    """Issue 22 (11): `--token` was silently ignored by the admin commands that talk to
    ZooKeeper alone; now a usage error saying why. Where a proxy or bookie takes it,
    it is accepted (the command then fails later only for want of a cluster)."""
    for argv in (
        ("zk", "tree"),
        ("bookie", "list"),
        ("cookie", "show", "bookie-1"),
        ("status",),
        ("underreplicated", "list"),
        ("autorecovery", "status"),
    ):
        out = run_cli(*argv, "--token", "t0ken", "--cluster", "/nonexistent.json")
        assert out.returncode == EXIT_USAGE, (argv, out.returncode, out.stderr)
        assert "ZooKeeper directly, which takes no token" in out.stderr, out.stderr
    for argv in (("stream", "list"), ("ledger", "show", "1"), ("group", "list")):
        out = run_cli(*argv, "--token", "t0ken", "--cluster", "/nonexistent.json")
        assert out.returncode not in (0, EXIT_USAGE), (argv, out.returncode, out.stderr)
        assert "takes no token" not in out.stderr, out.stderr

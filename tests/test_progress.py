"""Progress bars: drawn on stderr when it is a terminal (or BOOKLINE_PROGRESS=always),
never otherwise -- scripts, pipes and --json output see no escape codes."""

from __future__ import annotations

import pytest

from ops.progress import progress, wanted


def test_quiet_unless_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BOOKLINE_PROGRESS", raising=False)
    assert not wanted()  # pytest's stderr is no terminal
    with progress("copying", total=3, unit="entries") as bar:
        bar.update(advance=2)
        bar.total = 4
        bar.update(advance=2)
    assert bar.done == 4 and bar.total == 4
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_always_draws_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOOKLINE_PROGRESS", "always")
    with progress("copying", total=10, unit="entries") as bar:
        bar.update(done=10, note="copied")
    out = capsys.readouterr()
    assert out.out == ""
    assert "copied" in out.err and "10/10" in out.err, out.err
    monkeypatch.setenv("BOOKLINE_PROGRESS", "never")
    assert not wanted()

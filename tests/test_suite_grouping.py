"""The suite's own scheduling: ./test.sh runs ``pytest -n N --dist loadgroup`` and
tests/conftest.py groups the tests (a file per worker, the shared Spark session's files
on one worker). pytest 9.2 made pytest-xdist drop the groups without a word (every test
scheduled on its own); this checks, on a throw-away project with the same kind of
grouping hook, that a group still runs on one worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group("together"))
"""

TESTS = "".join(f"def test_{i}():\n    pass\n\n" for i in range(6))


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(TESTS)
    (tmp_path / "test_b.py").write_text(TESTS)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers = {m.group(1) for m in re.finditer(r"\[(gw\d+)\] \[\s*\d+%\] PASSED", out.stdout)}
    passed = len(re.findall(r"PASSED", out.stdout))
    assert passed == 12, out.stdout[-3000:]
    assert len(workers) == 1, f"one group ran on {sorted(workers)}:\n{out.stdout[-3000:]}"

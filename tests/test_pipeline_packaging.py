"""Shipping the connector to a cluster (issue 18, defect 5): ``spark-submit --master
local[2] --py-files`` from a Python that does not have Bookline installed.

The isolated Python is a fresh venv (no pip) whose one ``.pth`` line puts the project
venv's site-packages on its path -- so pyspark and the dependencies import, but not
Bookline itself: that ``.pth`` file is not processed, and Bookline's editable finder
lives in one. Each spark-submit is a child process in its own session, killed by pid
if it outlives its deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path
from typing import Any

import pytest

from streams.records import LogRecord

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SUBMIT_TIMEOUT_S = 180.0

JOB = """
import json, sys
from pyspark.sql import SparkSession

zk, root, src, dst, mode = sys.argv[1:6]
spark = SparkSession.builder.appName("bookline-packaging").getOrCreate()
if mode != "installed":  # with --py-files: Spark's own lookup does not see them
    import pipeline
    pipeline.register(spark)  # (and ships a wheel to the workers as a zip)
conn = {"zk": zk, "root": root}
df = spark.read.format("bookline").options(**conn).option("stream", src).load()
values = sorted(bytes(r["value"]).decode() for r in df.collect())
df.select("key", "value").write.format("bookline").options(**conn).option(
    "stream", dst).mode("append").save()
copied = spark.read.format("bookline").options(**conn).option("stream", dst).load().count()
print("RESULT " + json.dumps({"values": values, "copied": copied}), flush=True)
spark.stop()
"""


@pytest.fixture(scope="module")
def isolated_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("iso") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import pyspark, kazoo, pyarrow\ntry:\n import pipeline\nexcept ImportError:\n print('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(python), "-c", probe], check=False, capture_output=True, text=True, cwd="/", env=env
    )
    assert out.stdout.strip() == "ok", f"not isolated: {out.stdout} {out.stderr}"
    return python


def _submit(python: Path, shipped: Path, args: list[str], cwd: Path) -> dict[str, Any]:
    """``spark-submit --py-files shipped job.py args`` (mode "installed": the zip on
    every Python's PYTHONPATH instead, as if installed, and no --py-files)."""
    submit = Path(sys.executable).with_name("spark-submit")
    (cwd / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    files = ["--py-files", str(shipped)]
    if args[-1] == "installed":
        env["PYTHONPATH"], files = str(shipped), []
    argv = [
        str(submit), "--master", "local[2]", *files,
        "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1", str(cwd / "job.py"), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=SUBMIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"spark-submit failed:\n{out[-3000:]}\n{err[-6000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


@pytest.mark.parametrize("mode", ["zip", "whl", "installed"])
def test_spark_submit_with_py_files_runs_without_bookline_installed(
    isolated_python: Path, bookie_cluster: Any, tmp_path: Path, mode: str
) -> None:
    from ops.cli.pipeline import build_package
    from streams.sync import SyncNamespace

    shipped = build_package(tmp_path / "dist")
    if mode == "whl":  # a wheel is a zip with the packages at its root
        wheel = shipped.with_name("bookline-0.1.0-py3-none-any.whl")
        shutil.copyfile(shipped, wheel)
        shipped = wheel
    src, dst = f"pkg-{uuid.uuid4().hex[:8]}", f"pkg-copy-{uuid.uuid4().hex[:8]}"
    with SyncNamespace.open(bookie_cluster.zk, bookie_cluster.root) as ns:
        ns.create_stream(src)
        with ns.open_writer(src) as writer:
            writer.write_many([LogRecord(f"v{i}".encode()) for i in range(20)])
    result = _submit(
        isolated_python, shipped, [bookie_cluster.zk, bookie_cluster.root, src, dst, mode], tmp_path
    )
    assert result == {"values": sorted(f"v{i}" for i in range(20)), "copied": 20}

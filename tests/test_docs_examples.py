"""The README's and docs/core-api.md's Python examples, as written, against a real cluster.

Every fenced ``python`` block is taken from the file unchanged except for what names the
cluster (the cluster file path, ZooKeeper's connect string and root: see ``_CLUSTER``),
and run -- top-level ``await`` allowed, in the test's event loop; the blocks of one
file share one namespace, in order, as a reader would type them. A block that is not
Python is one of core-api.md's signature listings (``await ns.list_streams() ->
list[str]``): each call it lists is checked against the code instead -- parameter
names, order, keyword-only markers, documented defaults and annotations, and the
return annotation -- so a call written as the page says binds and means the same.
No block is skipped: one the checker cannot read fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import bookline
from bookline import LogReader, LogRecord, LogWriter, Namespace, StartPosition
from tests.conftest import BookieCluster

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CORE_API = ROOT / "docs" / "core-api.md"
EXAMPLE_TIMEOUT_S = 60.0  # an example that waits on a stuck read fails instead of hanging

# What names the cluster in the examples (the only text the test replaces).
_CLUSTER = {
    "file": ["/tmp/bl/cluster.json", "DIR/cluster.json", ".cluster/cluster.json"],
    "zk": ['zk="127.0.0.1:2181/local"'],
    "root": ['root="/bookline"'],
}


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.M | re.S)


def compiled(block: str, name: str) -> Any | None:
    """The block's code object, or None when it is not Python (a signature listing)."""
    try:
        return compile(block, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return None


def with_cluster(block: str, cluster: BookieCluster) -> str:
    """The block with the example cluster's names replaced by the test cluster's."""
    real = {
        "file": str(cluster.cluster_file()),
        "zk": f'zk="{cluster.zk}"',
        "root": f'root="{cluster.root}"',
    }
    for kind, examples in _CLUSTER.items():
        for example in examples:
            block = block.replace(example, real[kind])
    return block


async def run_block(code: Any, env: dict[str, Any]) -> None:
    result = eval(code, env)  # top-level await: a coroutine to run in this loop
    if inspect.isawaitable(result):
        await asyncio.wait_for(result, EXAMPLE_TIMEOUT_S)


def test_every_cluster_name_replaced_appears_in_an_example() -> None:
    """The replacement table cannot go stale: each entry is used by some example."""
    text = "".join(python_blocks(README) + python_blocks(CORE_API))
    for examples in _CLUSTER.values():
        for example in examples:
            assert example in text, f"no example names {example!r} any more"


# -- running the examples ------------------------------------------------------------


@pytest.fixture
async def opened(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[Namespace]]:
    """Every Namespace the examples open (they leave some open), closed afterwards."""
    namespaces: list[Namespace] = []
    real_open = Namespace.open

    async def recording_open(cls: type[Namespace], *args: Any, **kwargs: Any) -> Namespace:
        ns = await real_open(*args, **kwargs)
        namespaces.append(ns)
        return ns

    monkeypatch.setattr(Namespace, "open", classmethod(recording_open))
    yield namespaces
    for ns in namespaces:
        await ns.close()


async def _fresh_stream(cluster: BookieCluster, name: str) -> None:
    """What the README's shell step (``bookline stream create``) does before the example."""
    async with await Namespace.open(cluster.zk, cluster.root) as ns:
        if await ns.exists(name):
            await ns.delete_stream(name)
        await ns.create_stream(name)


@pytest.mark.integration
async def test_readme_core_example(bookie_cluster: BookieCluster, opened: list[Namespace]) -> None:
    await _fresh_stream(bookie_cluster, "orders")
    blocks = [b for b in python_blocks(README) if "spark" not in b]
    assert blocks, "the README has no core-library example"
    env: dict[str, Any] = {}
    try:
        for i, block in enumerate(blocks):
            code = compiled(with_cluster(block, bookie_cluster), f"README.md python block {i}")
            assert code is not None, f"README.md python block {i} is not Python"
            await run_block(code, env)
        # What the example says it does: a record written, durable, read back.
        assert env["record"].payload == b"hello"
        assert env["record"].dlsn == env["dlsn"]
        assert env["ProxyClient"] is bookline.ProxyClient
    finally:
        for name in ("reader", "writer"):
            if name in env:
                await env[name].close()


@pytest.mark.integration
@pytest.mark.spark
def test_readme_spark_example(bookie_cluster: BookieCluster, spark: Any) -> None:
    from bookline.sync import SyncNamespace

    payloads = [f"GET /{i} 200".encode() for i in range(50)]
    asyncio.run(_fresh_stream(bookie_cluster, "access-logs"))
    with (
        SyncNamespace.from_cluster_file(bookie_cluster.cluster_file()) as ns,
        ns.open_writer("access-logs") as writer,
    ):
        writer.write_many([LogRecord(p) for p in payloads])
    blocks = [b for b in python_blocks(README) if "spark" in b]
    assert blocks, "the README has no Spark example"
    env: dict[str, Any] = {}
    for i, block in enumerate(blocks):
        code = compiled(with_cluster(block, bookie_cluster), f"README.md spark block {i}")
        assert code is not None, f"README.md spark block {i} is not Python"
        assert eval(code, env) is None  # no top-level await in a Spark example
    rows = env["df"].select("value").collect()
    assert [bytes(r["value"]) for r in rows] == payloads


@pytest.mark.integration
async def test_core_api_examples_run(
    bookie_cluster: BookieCluster, opened: list[Namespace]
) -> None:
    env: dict[str, Any] = {}
    ran = 0
    for i, block in enumerate(python_blocks(CORE_API)):
        code = compiled(with_cluster(block, bookie_cluster), f"docs/core-api.md python block {i}")
        if code is not None:
            await run_block(code, env)
            ran += 1
    assert ran >= 2, "core-api.md's imports and 'Opening a namespace' examples did not run"
    assert isinstance(env["ns"], Namespace)
    assert len(opened) == 2  # Namespace.open and Namespace.from_cluster_file


# -- checking the signature listings -------------------------------------------------

# The objects the listings' variables name (core-api.md: ``ns = await Namespace.open``,
# ``w = await ns.open_writer``, ``r = await ns.open_reader``, the topic admin and
# producer).
RECEIVERS: dict[str, Any] = {
    "ns": Namespace,
    "w": LogWriter,
    "r": LogReader,
    "admin": bookline.TopicAdmin,  # admin = TopicAdmin(ns), producer = TopicProducer(ns)
    "producer": bookline.TopicProducer,
}

# A documented default the code spells differently: how the code's default means it.
EQUIVALENT_DEFAULTS: dict[tuple[str, str], Callable[[Any], Any]] = {
    # start=None is coerced to StartPosition.earliest()
    ("Namespace.open_reader", "start"): StartPosition.coerce,
}


@dataclasses.dataclass
class DocParam:
    name: str | None  # None: an example value (``LogRecord(b"x")``), checked by position
    keyword_only: bool = False
    default: str | None = None
    annotation: str | None = None


def _strip_comment(line: str) -> str:
    quote = ""
    for k, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:k]
    return line


def _depth(text: str) -> int:
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def statements(block: str) -> Iterator[str]:
    """Logical lines: a statement goes on while brackets are open or the next line
    starts with ``->`` (a return annotation on its own line)."""
    current = ""
    for raw in block.splitlines():
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if current and (_depth(current) > 0 or line.startswith("->")):
            current += " " + line
        else:
            if current:
                yield current
            current = line
    if current:
        yield current


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(text[start:k].strip())
            start = k + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def doc_params(args: str) -> list[DocParam]:
    out: list[DocParam] = []
    keyword_only = False
    for arg in _split_top(args):
        if arg == "*":
            keyword_only = True
            continue
        try:
            fn = ast.parse(f"def _f({arg}): pass").body[0]
        except SyntaxError:
            ast.parse(arg, mode="eval")  # an example value; anything else fails here
            out.append(DocParam(None))
            continue
        assert isinstance(fn, ast.FunctionDef)
        a = fn.args.args[0]
        default = ast.unparse(fn.args.defaults[0]) if fn.args.defaults else None
        annotation = ast.unparse(a.annotation) if a.annotation is not None else None
        out.append(DocParam(a.arg, keyword_only, default, annotation))
    return out


def _norm(annotation: Any) -> str:
    if isinstance(annotation, str):
        return ast.unparse(ast.parse(annotation, mode="eval"))
    return inspect.formatannotation(annotation)


def _leading_expression(text: str) -> str:
    """``DLSN of the next record to read`` -> ``DLSN``: a return type, then prose."""
    words = text.split()
    for n in range(len(words), 0, -1):
        candidate = " ".join(words[:n])
        try:
            ast.parse(candidate, mode="eval")
        except SyntaxError:
            continue
        return candidate
    raise AssertionError(f"no type in {text!r}")


def _resolve(target: str) -> tuple[str, Any]:
    if "." in target:
        receiver, attr = target.split(".", 1)
        cls = RECEIVERS[receiver]
        if not hasattr(cls, attr):  # a plain instance attribute, set in __init__
            assert f"self.{attr} =" in inspect.getsource(cls.__init__), f"{cls} has no {attr}"
            return f"{cls.__name__}.{attr}", None
        return f"{cls.__name__}.{attr}", inspect.getattr_static(cls, attr)
    return target, getattr(bookline, target)


def check_call(where: str, obj: Any, params: list[DocParam], returns: str | None) -> None:
    func = obj.__func__ if isinstance(obj, classmethod | staticmethod) else obj
    sig = inspect.signature(func)
    code = list(sig.parameters.values())
    if code and code[0].name in ("self", "cls") and not inspect.isclass(func):
        code = code[1:]
    positional = [p for p in code if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name: p for p in code}
    documented: set[str] = set()
    k = 0  # the next positional parameter
    for d in params:
        if d.keyword_only:
            p = names.get(d.name or "")
            assert p is not None, f"{where}: no parameter {d.name}"
            assert p.kind is p.KEYWORD_ONLY, f"{where}: {p.name} is not keyword-only"
        else:
            assert k < len(positional), f"{where}: argument {k + 1} has no parameter"
            p, k = positional[k], k + 1
            assert d.name in (None, p.name), f"{where}: argument {k} is {p}"
        documented.add(p.name)
        if d.default is not None:
            expected = eval(d.default, vars(bookline))
            convert = EQUIVALENT_DEFAULTS.get((where, p.name), lambda v: v)
            assert p.default is not p.empty, f"{where}: {p.name} has no default"
            assert convert(p.default) == expected, f"{where}: {p.name}={p.default!r}"
        if d.annotation is not None:
            assert _norm(p.annotation) == _norm(d.annotation), f"{where}: {p}"
    for p in code:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        assert p.name in documented or not required, f"{where}: {p.name} is not documented"
    if returns is not None:
        assert _norm(sig.return_annotation) == _norm(returns), f"{where} returns {sig}"


def check_attribute(target: str, returns: str | None) -> None:
    where, obj = _resolve(target)
    if returns is not None and isinstance(obj, property):
        annotation = inspect.signature(obj.fget).return_annotation  # type: ignore[arg-type]
        assert _norm(annotation) == _norm(_leading_expression(returns)), where


_STATEMENT = re.compile(
    r"(?:[\w, ]+ = )?(?:await )?(?P<target>[A-Za-z_][\w.]*)"
    r"(?:\((?P<args>.*)\))?\s*(?:->\s*(?P<returns>.+))?"
)


def check_statement(statement: str) -> None:
    if m := re.fullmatch(r"async for \w+ in (\w+): \.\.\.", statement):
        assert hasattr(RECEIVERS[m.group(1)], "__aiter__"), statement
        return
    if "(" not in statement and "," in statement:  # w.last_dlsn, w.last_txid
        for attr in _split_top(statement):
            check_attribute(attr, None)
        return
    m = _STATEMENT.fullmatch(statement)
    assert m is not None, f"cannot read {statement!r}"
    if m.group("args") is None:
        check_attribute(m.group("target"), m.group("returns"))
        return
    where, obj = _resolve(m.group("target"))
    check_call(where, obj, doc_params(m.group("args")), m.group("returns"))


def test_core_api_signature_listings_match_the_code() -> None:
    checked = 0
    for i, block in enumerate(python_blocks(CORE_API)):
        if compiled(block, f"docs/core-api.md python block {i}") is not None:
            continue  # an example: test_core_api_examples_run runs it
        for statement in statements(block):
            check_statement(statement)
            checked += 1
    assert checked >= 25, f"only {checked} listed calls checked"

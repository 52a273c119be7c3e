"""The read core's own settings and its place under the front ends (issue 23).

The core (``serving/read``) takes a :class:`ReadConfig` that the read proxy builds from
its settings: each field must carry the proxy's value and default, so a setting an
operator changes reaches the core. The core imports no aiohttp: a second front end
(Kafka's wire protocol) uses it without HTTP.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from readproxy.config import ReadProxyConfig
from serving.read.config import ReadConfig

ROOT = Path(__file__).resolve().parent.parent


def test_the_proxy_hands_every_core_setting_through() -> None:
    names = [f.name for f in dataclasses.fields(ReadConfig)]
    defaults = ReadProxyConfig()
    assert defaults.read_config() == ReadConfig()  # one default per setting
    changed = ReadProxyConfig(**{n: getattr(defaults, n) + 1 for n in names})
    core = changed.read_config()
    assert {n: getattr(core, n) for n in names} == {n: getattr(changed, n) for n in names}


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ReadConfig)])
def test_a_core_setting_must_be_positive(field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be positive"):
        ReadConfig(**{field: 0})


def test_the_cache_holds_at_least_one_feed() -> None:
    with pytest.raises(ConfigError, match="cache_bytes_max must be >= feed_bytes_max"):
        ReadConfig(feed_bytes_max=2 << 20, cache_bytes_max=1 << 20)


def test_the_serving_floor_imports_no_http_server() -> None:
    found = []
    for path in sorted((ROOT / "serving").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}: {m}" for m in modules
                      if m.split(".")[0] in {"aiohttp", "readproxy", "writeproxy"}]  # fmt: skip
    assert not found

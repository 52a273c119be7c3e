"""Write the message tables (``apis_*.py``) from Kafka's message schemas.

    python -m kafkaapi.protocol.gen_tables KAFKA/clients/src/main/resources/common/message

Kafka's ``*Request.json`` / ``*Response.json`` files are the facts (field names, types,
versions, tags, defaults); this tool transcribes them into the tables' vocabulary
(``schema.py``), so a schema change upstream is a re-run and a reviewed diff. It is not
imported at run time.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

# The table files: module name -> the APIs it holds (issue 25's list).
GROUPS: dict[str, tuple[str, ...]] = {
    "apis_cluster": (
        "ApiVersions",
        "Metadata",
        "DescribeCluster",
        "SaslHandshake",
        "SaslAuthenticate",
    ),
    "apis_data": ("Produce", "Fetch", "ListOffsets", "InitProducerId"),
    "apis_groups": (
        "FindCoordinator",
        "JoinGroup",
        "SyncGroup",
        "Heartbeat",
        "LeaveGroup",
        "OffsetCommit",
        "OffsetFetch",
        "ListGroups",
        "DescribeGroups",
        "DeleteGroups",
        "ConsumerGroupHeartbeat",
    ),
    "apis_admin": (
        "CreateTopics",
        "DeleteTopics",
        "CreatePartitions",
        "DescribeConfigs",
        "IncrementalAlterConfigs",
    ),
}

_INT_TYPES = {"int8", "int16", "uint16", "int32", "uint32", "int64"}


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def load(path: Path) -> dict[str, Any]:
    text = "\n".join(
        line for line in path.read_text().splitlines() if not line.strip().startswith("//")
    )
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def default_literal(field: dict[str, Any], kind: str) -> str | None:
    raw = field.get("default")
    if isinstance(raw, bool | int):
        raw = str(raw).lower()
    if raw is None:
        return None
    if raw == "null":
        return "NULL"
    if kind in _INT_TYPES:
        return repr(int(raw, 0))
    if kind == "bool":
        return repr(raw == "true")
    if kind == "float64":
        return repr(float(raw))
    if kind == "string":
        return repr(raw)
    return None


class Writer:
    def __init__(self, common: dict[str, list[dict[str, Any]]]) -> None:
        self.common = common

    def type_expr(self, field: dict[str, Any], indent: int) -> str:
        kind: str = field["type"]
        if kind.startswith("[]"):
            item = kind[2:]
            if "fields" in field or item in self.common:
                return f"Arr({self.struct_expr(field.get('fields') or self.common[item], indent)})"
            return f"Arr({item!r})"
        if "fields" in field or kind in self.common:
            return self.struct_expr(field.get("fields") or self.common[kind], indent)
        return repr(kind)

    def struct_expr(self, fields: list[dict[str, Any]], indent: int) -> str:
        pad = " " * (indent + 4)
        rows = "".join(f"{pad}{self.field_expr(f, indent + 4)},\n" for f in fields)
        return f"S(\n{rows}{' ' * indent})"

    def field_expr(self, field: dict[str, Any], indent: int) -> str:
        parts = [repr(snake(field["name"])), self.type_expr(field, indent), repr(field["versions"])]
        if "nullableVersions" in field:
            parts.append(f"nullable={field['nullableVersions']!r}")
        if "tag" in field:
            parts.append(f"tag={field['tag']!r}")
            parts.append(f"tagged={field['taggedVersions']!r}")
        literal = default_literal(field, field["type"])
        if literal is not None:
            parts.append(f"default={literal}")
        return f"F({', '.join(parts)})"


def api_expr(folder: Path, name: str) -> str:
    request = load(folder / f"{name}Request.json")
    response = load(folder / f"{name}Response.json")
    low, high = (int(v) for v in request["validVersions"].split("-"))
    floor = low
    deprecated = request.get("deprecatedVersions")
    if deprecated:
        floor = int(deprecated.split("-")[-1]) + 1
    lines = [f"{snake(name).upper()} = Api(", f"    {name!r},", f"    {request['apiKey']},"]
    lines.append(f"    versions=({low}, {high}),")
    lines.append(f"    advertised=({floor}, {high}),")
    lines.append(f"    flexible={request['flexibleVersions']!r},")
    for part, schema in (("request", request), ("response", response)):
        common = {c["name"]: c["fields"] for c in schema.get("commonStructs", [])}
        body = Writer(common).struct_expr(schema["fields"], 4)
        lines.append(f"    {part}={body},")
    lines.append(")")
    return "\n".join(lines)


def module_text(folder: Path, names: tuple[str, ...]) -> str:
    head = (
        '"""Message tables transcribed from Kafka\'s message schemas by\n'
        "``python -m kafkaapi.protocol.gen_tables`` (do not edit by hand):\n"
        + ",\n".join(names)
        + '.\n"""\n\n'
        "# fmt: off\n"
        "from kafkaapi.protocol.schema import NULL, Api, Arr, F, S\n\n"
        "__all__ = [\n"
        + "".join(f"    {snake(n).upper()!r},\n" for n in sorted(names, key=snake))
        + "]\n\n"
    )
    return head + "\n\n".join(api_expr(folder, n) for n in names) + "\n"


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    out = Path(__file__).parent
    for module, names in GROUPS.items():
        (out / f"{module}.py").write_text(module_text(folder, names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

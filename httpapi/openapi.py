"""The proxies' OpenAPI 3 document, built from code so it cannot drift from the codes.

Served by both proxies at ``/openapi.json``; ``python -m httpapi.openapi`` prints it
and ``docs/openapi.json`` is that output (a test keeps the two equal). This module
holds the paths and assembles the document; the bodies' schemas are
:mod:`httpapi.openapi_schemas`.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

from foundation.version import __version__
from httpapi.auth import ROUTE_RULES
from httpapi.openapi_schemas import schemas

_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "maxLength": 200},
    "description": "stream name",
}
_MEDIA = ("application/json", "application/msgpack")


def _content(ref: str) -> dict[str, Any]:
    return {m: {"schema": {"$ref": f"#/components/schemas/{ref}"}} for m in _MEDIA}


def _ok(ref: str, text: str = "OK") -> dict[str, Any]:
    return {"description": text, "content": _content(ref)}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"$ref": "#/components/responses/Error"} for s in statuses}


def build_document() -> dict[str, Any]:
    pos = {
        "name": "from",
        "in": "query",
        "schema": {"type": "string", "default": "earliest"},
        "description": "earliest | latest | seg:entry:slot | seq:N | txid:N | time:MS",
    }
    s = "/v1/streams/{name}"
    paths: dict[str, Any] = {
        "/health": {
            "get": {
                "summary": "state (ok, degraded, starting, stopping, down), why, and load "
                "(docs/metrics.md); JSON always",
                "responses": {
                    "200": _ok("Object", "serving: ok or degraded"),
                    "503": _ok("Object", "not serving: starting, stopping or down"),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text format)",
                "responses": {"200": {"description": "metrics"}},
            }
        },
        "/openapi.json": {
            "get": {"summary": "this document", "responses": {"200": {"description": "OpenAPI 3"}}}
        },
        "/dashboard": {
            "get": {
                "summary": "the live dashboard, an HTML page polling /v1/cluster (read proxy)",
                "responses": {"200": {"description": "HTML"}},
            }
        },
        "/v1/cluster": {
            "get": {
                "summary": "bookies with state and disks, proxies, streams, topics, groups' lag, "
                "under-replicated ledgers, autorecovery's auditor and replication switch, "
                "ZooKeeper's session and servers, totals and recent errors (read proxy; "
                "readproxy/cluster.py)",
                "responses": {"200": _ok("Object"), **_errors(503)},
            }
        },
        "/v1/streams": {
            "get": {
                "summary": "list streams (both proxies)",
                "responses": {"200": _ok("StreamList"), **_errors(503)},
            },
            "post": {
                "summary": "create a stream (write proxy)",
                "requestBody": {"content": _content("Object")},
                "responses": {"201": _ok("Object", "created"), **_errors(400, 409)},
            },
        },
        s: {
            "parameters": [_NAME],
            "get": {
                "summary": "describe (both proxies)",
                "responses": {"200": _ok("StreamInfo"), **_errors(400, 404)},
            },
            "delete": {
                "summary": "delete the stream and its ledgers (write proxy)",
                "responses": {"200": _ok("Object"), **_errors(307, 400, 404)},
            },
        },
        f"{s}/records": {
            "parameters": [_NAME],
            "post": {
                "summary": "write one record or a batch (write proxy; owner only)",
                "requestBody": {"required": True, "content": _content("WriteRequest")},
                "responses": {
                    "200": _ok("WriteAnswer", "durable"),
                    **_errors(307, 400, 404, 409, 413, 429, 503),
                },
            },
            "get": {
                "summary": "read a page; wait_ms > 0 long-polls (read proxy)",
                "parameters": [
                    pos,
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "default": 100}},
                    {"name": "wait_ms", "in": "query", "schema": {"type": "integer", "default": 0}},
                ],
                "responses": {"200": _ok("ReadAnswer"), **_errors(400, 404, 410, 429)},
            },
        },
        f"{s}/recordsets": {
            "parameters": [_NAME],
            "get": {
                "summary": "catch-up read: the entries' record sets as stored, handed through "
                "(read proxy; binary, see httpapi/recordsets.py)",
                "parameters": [
                    pos,
                    {"name": "bytes_max", "in": "query", "schema": {"type": "integer"}},
                    {"name": "wait_ms", "in": "query", "schema": {"type": "integer", "default": 0}},
                ],
                "responses": {
                    "200": {
                        "description": "record sets (magic BLRS, version, CRC32C)",
                        "content": {
                            "application/vnd.bookline.recordsets": {
                                "schema": {"type": "string", "format": "binary"}
                            }
                        },
                    },
                    **_errors(400, 404, 410, 429),
                },
            },
        },
        f"{s}/tail": {
            "parameters": [_NAME],
            "get": {
                "summary": "WebSocket tail (read proxy): frames are ReadAnswer objects, "
                "binary msgpack (text JSON with format=json)",
                "parameters": [
                    {**pos, "schema": {"type": "string", "default": "latest"}},
                    {
                        "name": "format",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["msgpack", "json"]},
                    },
                ],
                "responses": {
                    "101": {"description": "switching protocols"},
                    **_errors(400, 404, 429),
                },
            },
        },
        f"{s}/heartbeat": {
            "parameters": [_NAME],
            "post": {
                "summary": "own the stream (acquire when free) and flush its writer",
                "responses": {"200": _ok("Object"), **_errors(307, 503)},
            },
        },
        f"{s}/truncate": {
            "parameters": [_NAME],
            "post": {
                "summary": "truncate everything before {dlsn}",
                "requestBody": {"content": _content("Object")},
                "responses": {"200": _ok("Object"), **_errors(307, 400, 503)},
            },
        },
        f"{s}/release": {
            "parameters": [_NAME],
            "post": {
                "summary": "stop owning the stream (another proxy may take it)",
                "responses": {"200": _ok("Object"), **_errors(307)},
            },
        },
        f"{s}/owner": {
            "parameters": [_NAME],
            "get": {
                "summary": "the owning write proxy's URL (null when none)",
                "responses": {"200": _ok("Object")},
            },
        },
    }
    paths.update(_topic_paths())
    paths.update(_group_paths())
    for path, item in _consumer_paths().items():  # a path may have a write route already
        for key, value in item.items():
            paths.setdefault(path, {}).setdefault(key, value)
    _add_security(paths)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Bookline proxies",
            "version": __version__,
            "description": "Write proxies own streams and append records; read proxies "
            "serve reads and tails. Bodies are msgpack (clients) or JSON "
            "(humans), chosen by Content-Type and Accept. Every error is "
            "{code, name, message} with Bookline's stable codes; 307 "
            "OWNER_MOVED carries the owner's URL in 'owner' and Location.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "responses": {"Error": {"description": "an error", "content": _content("Error")}},
            "securitySchemes": {"bearer": _BEARER},
        },
    }


_BEARER: Final = {
    "type": "http",
    "scheme": "bearer",
    "description": "a Bookline token (docs/security.md) when the proxy's auth is on; "
    "WebSocket tails may pass it as the 'token' query parameter instead",
}
_METHODS: Final = ("get", "post", "put", "patch", "delete")


def _add_security(paths: dict[str, Any]) -> None:
    """Each operation's access rule (httpapi.auth.ROUTE_RULES): open ones need no
    token; the others say 401 without a valid one, and 403 when grants are checked."""
    for path, item in paths.items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            rule = ROUTE_RULES[(method.upper(), path)]  # a route without a rule: KeyError
            if rule.open:
                op["security"] = []
                continue
            op["security"] = [{"bearer": []}]
            op["responses"].update(_errors(401, *((403,) if rule.guarded else ())))


# -- topics (writeproxy/topics.py, httpapi/topics.py) -----------------------------------


def _topic_paths() -> dict[str, Any]:
    topic = {
        "name": "topic",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "maxLength": 200},
        "description": "topic name",
    }
    partition = {
        "name": "partition",
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
        "description": "partition number (stream 'topic~partition')",
    }
    t = "/v1/topics/{topic}"
    return {
        "/v1/topics": {
            "get": {
                "summary": "list topics (write proxy)",
                "responses": {"200": _ok("TopicList"), **_errors(503)},
            },
            "post": {
                "summary": "create a topic and its partition streams (write proxy)",
                "requestBody": {"required": True, "content": _content("TopicCreate")},
                "responses": {"201": _ok("Topic", "created"), **_errors(400, 409, 503)},
            },
        },
        t: {
            "parameters": [topic],
            "get": {
                "summary": "the topic's partition count, options and every config",
                "responses": {"200": _ok("Topic"), **_errors(400, 404)},
            },
            "patch": {
                "summary": "grow the partition count (never shrinks)",
                "requestBody": {"required": True, "content": _content("TopicAlter")},
                "responses": {"200": _ok("Topic"), **_errors(400, 404, 409)},
            },
            "delete": {
                "summary": "delete the topic, its partition streams and their ledgers",
                "responses": {"200": _ok("Object"), **_errors(400, 404)},
            },
        },
        f"{t}/configs": {
            "parameters": [topic],
            "patch": {
                "summary": "set topic configs by Kafka's names (null: back to the default); "
                "UNKNOWN_CONFIG (53) names the known ones, INVALID_CONFIG (52) a bad value",
                "requestBody": {"required": True, "content": _content("TopicConfigsAlter")},
                "responses": {"200": _ok("Topic"), **_errors(400, 404, 409)},
            },
        },
        f"{t}/partitions": {
            "parameters": [topic],
            "get": {
                "summary": "every partition's start and end offsets, size and owner",
                "responses": {"200": _ok("TopicPartitions"), **_errors(400, 404)},
            },
        },
        f"{t}/partitions/{{partition}}/records": {
            "parameters": [topic, partition],
            "post": {
                "summary": "write to a partition (as a stream write; the answer's offsets "
                "are the partition's); UNKNOWN_PARTITION (47) for a partition the topic "
                "does not have",
                "requestBody": {"required": True, "content": _content("WriteRequest")},
                "responses": {
                    "200": _ok("WriteAnswer", "durable"),
                    **_errors(307, 400, 404, 409, 413, 429, 503),
                },
            },
        },
    }


# -- consumer groups (writeproxy/groups.py, groups/wire.py) -----------------------------


def _group_paths() -> dict[str, Any]:
    group = {
        "name": "group",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "maxLength": 200},
        "description": "consumer group name (its coordinator owns the stream 'group~group')",
    }
    g = "/v1/groups/{group}"

    def post(summary: str, body: str, answer: str, *statuses: int) -> dict[str, Any]:
        return {
            "parameters": [group],
            "post": {
                "summary": summary,
                "requestBody": {"required": True, "content": _content(body)},
                "responses": {"200": _ok(answer), **_errors(307, 400, 404, *statuses, 503)},
            },
        }

    return {
        "/v1/groups": {
            "get": {
                "summary": "the namespace's consumer groups (any write proxy)",
                "responses": {"200": _ok("GroupList"), **_errors(503)},
            },
        },
        g: {
            "parameters": [group],
            "get": {
                "summary": "describe: members, generation, committed offsets, end offsets, lag "
                "(the coordinator; 307 elsewhere)",
                "responses": {"200": _ok("Group"), **_errors(307, 400, 404, 503)},
            },
            "delete": {
                "summary": "delete the group and its offsets; GROUP_NOT_EMPTY (46) while "
                "members live",
                "responses": {"200": _ok("Object"), **_errors(307, 400, 404, 409, 503)},
            },
        },
        f"{g}/offsets": {
            "parameters": [group],
            "get": {
                "summary": "committed offsets (not generation-checked)",
                "responses": {"200": _ok("GroupOffsets"), **_errors(307, 400, 404, 503)},
            },
        },
        f"{g}/join": post(
            "join the group (creates it); BAD_REQUEST for an unknown assignor or topic",
            "GroupJoin",
            "GroupJoinAnswer",
        ),
        f"{g}/heartbeat": post(
            "keep the session; learn the assignment; STALE_GENERATION (44) -> join again",
            "GroupHeartbeat",
            "GroupHeartbeatAnswer",
            409,
        ),
        f"{g}/commit": post(
            "commit offsets; STALE_GENERATION (44), NOT_ASSIGNED (45), OUT_OF_RANGE (40)",
            "GroupCommit",
            "Object",
            409,
        ),
        f"{g}/leave": post("leave the group", "GroupLeave", "Object"),
        f"{g}/reset-offsets": post(
            "reset committed offsets (only the plan with dry_run); GROUP_NOT_EMPTY (46) "
            "while members live",
            "GroupReset",
            "GroupResetPlan",
            409,
        ),
    }


def main() -> int:
    sys.stdout.write(json.dumps(build_document(), indent=2) + "\n")
    return 0


# -- consumers: partitions by offset, subscriptions (readproxy/topics.py, subscriptions.py)


def _consumer_paths() -> dict[str, Any]:
    topic = {"name": "topic", "in": "path", "required": True, "description": "topic name",
             "schema": {"type": "string", "maxLength": 200}}  # fmt: skip
    partition = {"name": "partition", "in": "path", "required": True,
                 "schema": {"type": "integer", "minimum": 0},
                 "description": "partition number (stream 'topic~partition')"}  # fmt: skip
    sub = {"name": "sub", "in": "path", "required": True,
           "schema": {"type": "string", "maxLength": 200}, "description": "subscriber"}  # fmt: skip
    query = [
        {"name": "offset", "in": "query", "required": True, "schema": {"type": "integer"}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "default": 500}},
        {"name": "wait_ms", "in": "query", "schema": {"type": "integer", "default": 0}},
    ]
    p = "/v1/topics/{topic}/partitions/{partition}"
    s = "/v1/streams/{name}/subscriptions"
    return {
        f"{p}/records": {
            "parameters": [topic, partition],
            "get": {
                "summary": "read a partition from an offset (read proxy); wait_ms > 0 "
                "long-polls at the end; OUT_OF_RANGE (40) past the end offset or before "
                "the first offset kept",
                "parameters": query,
                "responses": {"200": _ok("PartitionPage"), **_errors(400, 404, 429)},
            },
        },
        f"{p}/offsets": {
            "parameters": [topic, partition],
            "get": {
                "summary": "the first offset kept (at=earliest), the end offset "
                "(at=latest) or the first record's at or after a time (at=time:MS) "
                "(read proxy)",
                "parameters": [
                    {"name": "at", "in": "query", "schema": {"type": "string", "default": "latest"}}
                ],
                "responses": {"200": _ok("PartitionOffset"), **_errors(400, 404)},
            },
        },
        s: {
            "parameters": [_NAME],
            "get": {
                "summary": "the stream's core subscriptions (read proxy)",
                "responses": {"200": _ok("SubscriberList"), **_errors(400, 404)},
            },
        },
        f"{s}/{{sub}}": {
            "parameters": [_NAME, sub],
            "get": {
                "summary": "a subscription's committed position (read proxy)",
                "responses": {"200": _ok("Subscription"), **_errors(400, 404)},
            },
            "post": {
                "summary": "advance a subscription (positions only move forward)",
                "requestBody": {"required": True, "content": _content("SubscriptionCommit")},
                "responses": {"200": _ok("SubscriptionAdvanced"), **_errors(400, 404)},
            },
            "delete": {
                "summary": "forget a subscription",
                "responses": {"200": _ok("Object"), **_errors(400, 404)},
            },
        },
    }


if __name__ == "__main__":
    sys.exit(main())

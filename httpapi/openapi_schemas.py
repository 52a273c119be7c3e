"""The component schemas of the proxies' OpenAPI document (the bodies: records, pages,
positions, topics, consumer groups, subscriptions); :mod:`httpapi.openapi` builds the
paths that refer to them and assembles the document.
"""

from __future__ import annotations

from typing import Any

from foundation.errors import registered_codes
from foundation.names import PARTITIONS_MAX
from httpapi.topics import OPTION_FIELDS as TOPIC_OPTION_FIELDS

_BYTES = {
    "type": "string",
    "description": "UTF-8 text in JSON (or the *_b64 variant); binary in msgpack",
}
_DLSN = {"type": "string", "pattern": "^[0-9]+:[0-9]+:[0-9]+$", "example": "3:17:0"}
_VALUE = {
    **_BYTES,
    "nullable": True,
    "description": f"{_BYTES['description']}; null: Kafka's null value",
}
# Kafka's headers: ordered [name, value] pairs, names may repeat, a value may be null.
_HEADERS = {
    "type": "array",
    "description": "Kafka's headers: [name, value] pairs in order, names may repeat, a "
    "value may be null; in JSON the values are UTF-8 text, or all base64 under "
    "headers_b64 (an object {name: value} is still accepted on writes)",
    "items": {
        "type": "array",
        "minItems": 2,
        "maxItems": 2,
        "items": {"type": "string", "nullable": True},
    },
}
_TS_TYPE = {
    "type": "string",
    "enum": ["CreateTime", "LogAppendTime"],
    "description": "whose time ts is: the producer's (or the writer's clock) or the log's",
}


def schemas() -> dict[str, Any]:
    record_in = {
        "type": "object",
        "required": ["payload"],
        "properties": {
            "payload": _VALUE,
            "payload_b64": {"type": "string"},
            "key": _BYTES,
            "headers": _HEADERS,
            "headers_b64": _HEADERS,
            "timestamp": {
                "type": "integer",
                "minimum": 0,
                "description": "the producer's time (CreateTime), ms since the epoch; "
                "absent: the log stamps the append time",
            },
            "txid": {"type": "integer", "minimum": 0},
        },
    }
    return {
        "Error": {
            "type": "object",
            "required": ["code", "name", "message"],
            "properties": {
                "code": {
                    "type": "integer",
                    "description": "stable Bookline error code",
                    "enum": sorted(registered_codes()),
                },
                "name": {"type": "string"},
                "message": {"type": "string"},
                "owner": {"type": "string", "description": "OWNER_MOVED: the owner's URL"},
            },
        },
        "WriteRequest": {
            "type": "object",
            "description": "One record (payload at top level), plain payloads, or records. "
            "Record i has producer sequence seq+i within the producer's "
            "epoch; a retry with the same producer, epoch and seq is "
            "answered with the original DLSNs. A producer whose batch "
            "failed for good bumps its epoch and starts again at seq 0; "
            "older epochs of it are then refused (PRODUCER_FENCED).",
            "properties": {
                "producer": {"type": "string", "maxLength": 64},
                "epoch": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "default": 0},
                "seq": {"type": "integer", "minimum": 0},
                "payload": _VALUE,
                "payloads": {"type": "array", "items": _VALUE},
                "keys": {
                    "type": "array",
                    "items": {**_BYTES, "nullable": True},
                    "description": "with payloads: one key (or null) per payload",
                },
                "records": {"type": "array", "items": record_in},
                "crc": {"type": "integer", "description": "CRC32C of all payloads"},
            },
        },
        "WriteAnswer": {
            "type": "object",
            "properties": {
                "dlsns": {"type": "array", "items": _DLSN, "description": "JSON answers"},
                "dlsn": _DLSN,
                "runs": {
                    "type": "array",
                    "description": "msgpack answers: [segment, entry, first_slot, count] per run",
                    "items": {"type": "array", "items": {"type": "integer"}},
                },
                "duplicates": {
                    "type": "integer",
                    "description": "leading records recognised as retries",
                },
                "offsets": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "JSON answers: each record's offset (sequence id)",
                },
                "offset": {"type": "integer", "description": "JSON, one record: its offset"},
                "offset_runs": {
                    "type": "array",
                    "description": "msgpack answers: [first_offset, count] per run",
                    "items": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
        "Record": {
            "type": "object",
            "required": ["dlsn", "seq", "txid", "ts", "payload"],
            "properties": {
                "dlsn": _DLSN,
                "seq": {"type": "integer"},
                "txid": {"type": "integer"},
                "ts": {"type": "integer", "description": "ms since the epoch"},
                "ts_type": _TS_TYPE,
                "payload": _VALUE,
                "key": _BYTES,
                "headers": _HEADERS,
                "headers_b64": _HEADERS,
            },
        },
        "ReadAnswer": {
            "type": "object",
            "required": ["records", "next"],
            "properties": {
                "records": {"type": "array", "items": {"$ref": "#/components/schemas/Record"}},
                "next": {"type": "string", "example": "seq:42"},
            },
        },
        "StreamList": {
            "type": "object",
            "properties": {"streams": {"type": "array", "items": {"type": "string"}}},
        },
        "StreamInfo": {
            "type": "object",
            "description": "docs/core-api.md StreamInfo; write proxies add 'owner'",
            "additionalProperties": True,
        },
        "Object": {"type": "object", "additionalProperties": True},
        **_topic_schemas(),
        **_group_schemas(),
        **_consumer_schemas(),
    }


# -- topics (writeproxy/topics.py, httpapi/topics.py) -----------------------------------


def _topic_schemas() -> dict[str, Any]:
    positive = {"type": "integer", "minimum": 1}
    options = {f: positive for f in TOPIC_OPTION_FIELDS}
    partitions = {"type": "integer", "minimum": 1, "maximum": PARTITIONS_MAX}
    return {
        "TopicCreate": {
            "type": "object",
            "required": ["name", "partitions"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "maxLength": 200},
                "partitions": partitions,
                **options,
            },
        },
        "TopicAlter": {
            "type": "object",
            "required": ["partitions"],
            "additionalProperties": False,
            "description": "grow only: a smaller count is BAD_REQUEST",
            "properties": {"partitions": partitions},
        },
        "Topic": {
            "type": "object",
            "required": ["name", "partitions", "options", "ctime_ms"],
            "properties": {
                "name": {"type": "string"},
                "partitions": partitions,
                "options": {"type": "object", "properties": options},
                "ctime_ms": {"type": "integer"},
            },
        },
        "TopicList": {
            "type": "object",
            "properties": {"topics": {"type": "array", "items": {"type": "string"}}},
        },
        "TopicPartitions": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "integer"},
                            "stream": {"type": "string", "description": "'topic~partition'"},
                            "start_offset": {"type": "integer"},
                            "end_offset": {
                                "type": "integer",
                                "description": "the offset the next record gets",
                            },
                            "size_bytes": {"type": "integer"},
                            "segments": {"type": "integer"},
                            "owner": {"type": "string", "nullable": True},
                        },
                    },
                },
            },
        },
    }


# -- consumer groups (writeproxy/groups.py, groups/wire.py) -----------------------------


def _group_schemas() -> dict[str, Any]:
    name = {"type": "string", "maxLength": 200}
    tp = {
        "type": "array",
        "description": "[topic, partition]",
        "items": {"oneOf": [name, {"type": "integer", "minimum": 0}]},
        "minItems": 2,
        "maxItems": 2,
    }
    offset = {
        "type": "array",
        "description": "[topic, partition, offset] (the next offset to consume)",
        "items": {"oneOf": [name, {"type": "integer", "minimum": 0}]},
        "minItems": 3,
        "maxItems": 3,
    }
    tps = {"type": "array", "items": tp}
    offsets = {"type": "array", "items": offset}
    member_id = {"type": "string", "maxLength": 256}
    generation = {"type": "integer", "minimum": 0}

    def strict(required: list[str], properties: dict[str, Any], text: str) -> dict[str, Any]:
        return {
            "type": "object",
            "required": required,
            "additionalProperties": False,
            "description": text,
            "properties": properties,
        }

    return {
        "GroupJoin": strict(
            ["topics"],
            {
                "member_id": member_id,
                "instance_id": {**name, "description": "static membership (KIP-345)"},
                "topics": {"type": "array", "items": name, "minItems": 1, "maxItems": 100},
                "assignor": {
                    "type": "string",
                    "enum": ["cooperative-sticky", "range", "roundrobin"],
                    "default": "cooperative-sticky",
                },
                "session_timeout_ms": {
                    "type": "integer",
                    "minimum": 1_000,
                    "maximum": 300_000,
                    "default": 10_000,
                },
                "owned": tps,
            },
            "join, or re-join with member_id after STALE_GENERATION",
        ),
        "GroupJoinAnswer": {
            "type": "object",
            "properties": {
                "member_id": member_id,
                "generation": generation,
                "assignment": {**tps, "description": "the partitions to consume now"},
                "heartbeat_interval_ms": {"type": "integer"},
            },
        },
        "GroupHeartbeat": strict(
            ["member_id", "generation"],
            {"member_id": member_id, "generation": generation, "owned": tps},
            "owned: what the member consumes now (revoked partitions left out)",
        ),
        "GroupHeartbeatAnswer": {
            "type": "object",
            "properties": {"generation": generation, "assignment": tps},
        },
        "GroupCommit": strict(
            ["member_id", "generation", "offsets"],
            {"member_id": member_id, "generation": generation, "offsets": offsets},
            "answered once durable in the group's log; OUT_OF_RANGE beyond a partition's "
            "end, NOT_ASSIGNED for a partition the member does not hold",
        ),
        "GroupLeave": strict(["member_id"], {"member_id": member_id}, "a member leaves"),
        "GroupReset": strict(
            ["to"],
            {
                "to": {"type": "string", "enum": ["earliest", "latest", "offset", "datetime"]},
                "value": {
                    "type": "integer",
                    "description": "offset, or ms since the epoch for datetime",
                },
                "topics": {"type": "array", "items": name},
                "dry_run": {
                    "type": "boolean",
                    "description": "only compute the plan; nothing changes (default false)",
                },
            },
            "refused with GROUP_NOT_EMPTY while the group has live members; an offset "
            "past a partition's end is clamped to the end",
        ),
        "GroupResetPlan": {
            "type": "object",
            "properties": {
                "offsets": offsets,
                "clamped": {
                    **tps,
                    "description": "partitions whose asked offset was past their end",
                },
                "dry_run": {"type": "boolean", "description": "true: nothing was changed"},
            },
        },
        "GroupOffsets": {"type": "object", "properties": {"offsets": offsets}},
        "GroupList": {
            "type": "object",
            "properties": {"groups": {"type": "array", "items": name}},
        },
        "Group": {
            "type": "object",
            "properties": {
                "group": name,
                "state": {"type": "string", "enum": ["empty", "stable", "rebalancing"]},
                "generation": generation,
                "assignor": {"type": "string", "nullable": True},
                "coordinator": {"type": "string", "description": "the hosting proxy's URL"},
                "lag": {"type": "integer", "description": "sum over the partitions"},
                "members": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "member_id": member_id,
                            "instance_id": {**name, "nullable": True},
                            "topics": {"type": "array", "items": name},
                            "session_timeout_ms": {"type": "integer"},
                            "assignment": {**tps, "description": "target"},
                            "consuming": {**tps, "description": "now (handoffs pending)"},
                            "owned": {**tps, "description": "as last reported"},
                        },
                    },
                },
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "topic": name,
                            "partition": {"type": "integer"},
                            "member_id": {**member_id, "nullable": True},
                            "committed": {"type": "integer", "nullable": True},
                            "start": {"type": "integer", "nullable": True},
                            "end": {"type": "integer", "nullable": True},
                            "lag": {
                                "type": "integer",
                                "nullable": True,
                                "description": "end - committed (end - start without a commit)",
                            },
                        },
                    },
                },
            },
        },
    }


# -- consumers: partitions by offset, subscriptions (readproxy/topics.py, subscriptions.py)


def _consumer_schemas() -> dict[str, Any]:
    return {
        "PartitionPage": {
            "type": "object",
            "required": ["next_offset"],
            "description": "msgpack answers carry 'rows' ([offset, ts, key|nil, value|nil, "
            "headers|nil, ts_type] per record, ts_type 0 CreateTime or 1 LogAppendTime), "
            "JSON answers 'records'; offsets are contiguous from the asked one",
            "properties": {
                "rows": {"type": "array", "items": {"type": "array"}},
                "records": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["offset", "ts", "value"],
                        "properties": {
                            "offset": {"type": "integer"},
                            "ts": {"type": "integer", "description": "ms since the epoch"},
                            "ts_type": _TS_TYPE,
                            "key": _BYTES,
                            "value": _VALUE,
                            "headers": _HEADERS,
                            "headers_b64": _HEADERS,
                        },
                    },
                },
                "next_offset": {"type": "integer", "description": "where the next page starts"},
            },
        },
        "PartitionOffset": {
            "type": "object",
            "required": ["offset"],
            "properties": {"offset": {"type": "integer"}},
        },
        "Subscription": {
            "type": "object",
            "properties": {
                "subscriber": {"type": "string"},
                "dlsn": {**_DLSN, "nullable": True, "description": "null: never committed"},
            },
        },
        "SubscriptionCommit": {
            "type": "object",
            "required": ["dlsn"],
            "properties": {"dlsn": _DLSN},
        },
        "SubscriptionAdvanced": {
            "type": "object",
            "properties": {
                "advanced": {"type": "boolean", "description": "false: already there or past"},
                "dlsn": _DLSN,
            },
        },
        "SubscriberList": {
            "type": "object",
            "properties": {"subscribers": {"type": "array", "items": {"type": "string"}}},
        },
    }

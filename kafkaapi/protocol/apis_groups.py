"""Message tables transcribed from Kafka's message schemas by
``python -m kafkaapi.protocol.gen_tables`` (do not edit by hand):
FindCoordinator,
JoinGroup,
SyncGroup,
Heartbeat,
LeaveGroup,
OffsetCommit,
OffsetFetch,
ListGroups,
DescribeGroups,
DeleteGroups,
ConsumerGroupHeartbeat.
"""

# fmt: off
from kafkaapi.protocol.schema import NULL, Api, Arr, F, S

__all__ = [
    'CONSUMER_GROUP_HEARTBEAT',
    'DELETE_GROUPS',
    'DESCRIBE_GROUPS',
    'FIND_COORDINATOR',
    'HEARTBEAT',
    'JOIN_GROUP',
    'LEAVE_GROUP',
    'LIST_GROUPS',
    'OFFSET_COMMIT',
    'OFFSET_FETCH',
    'SYNC_GROUP',
]

FIND_COORDINATOR = Api(
    'FindCoordinator',
    10,
    versions=(0, 6),
    advertised=(1, 6),
    flexible='3+',
    request=S(
        F('key', 'string', '0-3'),
        F('key_type', 'int8', '1+', default=0),
        F('coordinator_keys', Arr('string'), '4+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '0-3'),
        F('error_message', 'string', '1-3', nullable='1-3'),
        F('node_id', 'int32', '0-3'),
        F('host', 'string', '0-3'),
        F('port', 'int32', '0-3'),
        F('coordinators', Arr(S(
            F('key', 'string', '4+'),
            F('node_id', 'int32', '4+'),
            F('host', 'string', '4+'),
            F('port', 'int32', '4+'),
            F('error_code', 'int16', '4+'),
            F('error_message', 'string', '4+', nullable='4+'),
        )), '4+'),
    ),
)

JOIN_GROUP = Api(
    'JoinGroup',
    11,
    versions=(0, 9),
    advertised=(2, 9),
    flexible='6+',
    request=S(
        F('group_id', 'string', '0+'),
        F('session_timeout_ms', 'int32', '0+'),
        F('rebalance_timeout_ms', 'int32', '1+', default=-1),
        F('member_id', 'string', '0+'),
        F('group_instance_id', 'string', '5+', nullable='5+', default=NULL),
        F('protocol_type', 'string', '0+'),
        F('protocols', Arr(S(
            F('name', 'string', '0+'),
            F('metadata', 'bytes', '0+'),
        )), '0+'),
        F('reason', 'string', '8+', nullable='8+', default=NULL),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '2+'),
        F('error_code', 'int16', '0+'),
        F('generation_id', 'int32', '0+', default=-1),
        F('protocol_type', 'string', '7+', nullable='7+', default=NULL),
        F('protocol_name', 'string', '0+', nullable='7+'),
        F('leader', 'string', '0+'),
        F('skip_assignment', 'bool', '9+', default=False),
        F('member_id', 'string', '0+'),
        F('members', Arr(S(
            F('member_id', 'string', '0+'),
            F('group_instance_id', 'string', '5+', nullable='5+', default=NULL),
            F('metadata', 'bytes', '0+'),
        )), '0+'),
    ),
)

SYNC_GROUP = Api(
    'SyncGroup',
    14,
    versions=(0, 5),
    advertised=(0, 5),
    flexible='4+',
    request=S(
        F('group_id', 'string', '0+'),
        F('generation_id', 'int32', '0+'),
        F('member_id', 'string', '0+'),
        F('group_instance_id', 'string', '3+', nullable='3+', default=NULL),
        F('protocol_type', 'string', '5+', nullable='5+', default=NULL),
        F('protocol_name', 'string', '5+', nullable='5+', default=NULL),
        F('assignments', Arr(S(
            F('member_id', 'string', '0+'),
            F('assignment', 'bytes', '0+'),
        )), '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '0+'),
        F('protocol_type', 'string', '5+', nullable='5+', default=NULL),
        F('protocol_name', 'string', '5+', nullable='5+', default=NULL),
        F('assignment', 'bytes', '0+'),
    ),
)

HEARTBEAT = Api(
    'Heartbeat',
    12,
    versions=(0, 4),
    advertised=(0, 4),
    flexible='4+',
    request=S(
        F('group_id', 'string', '0+'),
        F('generation_id', 'int32', '0+'),
        F('member_id', 'string', '0+'),
        F('group_instance_id', 'string', '3+', nullable='3+', default=NULL),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '0+'),
    ),
)

LEAVE_GROUP = Api(
    'LeaveGroup',
    13,
    versions=(0, 5),
    advertised=(0, 5),
    flexible='4+',
    request=S(
        F('group_id', 'string', '0+'),
        F('member_id', 'string', '0-2'),
        F('members', Arr(S(
            F('member_id', 'string', '3+'),
            F('group_instance_id', 'string', '3+', nullable='3+', default=NULL),
            F('reason', 'string', '5+', nullable='5+', default=NULL),
        )), '3+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '0+'),
        F('members', Arr(S(
            F('member_id', 'string', '3+'),
            F('group_instance_id', 'string', '3+', nullable='3+'),
            F('error_code', 'int16', '3+'),
        )), '3+'),
    ),
)

OFFSET_COMMIT = Api(
    'OffsetCommit',
    8,
    versions=(0, 9),
    advertised=(2, 9),
    flexible='8+',
    request=S(
        F('group_id', 'string', '0+'),
        F('generation_id_or_member_epoch', 'int32', '1+', default=-1),
        F('member_id', 'string', '1+'),
        F('group_instance_id', 'string', '7+', nullable='7+', default=NULL),
        F('retention_time_ms', 'int64', '2-4', default=-1),
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('committed_offset', 'int64', '0+'),
                F('committed_leader_epoch', 'int32', '6+', default=-1),
                F('commit_timestamp', 'int64', '1', default=-1),
                F('committed_metadata', 'string', '0+', nullable='0+'),
            )), '0+'),
        )), '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '3+'),
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('error_code', 'int16', '0+'),
            )), '0+'),
        )), '0+'),
    ),
)

OFFSET_FETCH = Api(
    'OffsetFetch',
    9,
    versions=(0, 9),
    advertised=(1, 9),
    flexible='6+',
    request=S(
        F('group_id', 'string', '0-7'),
        F('topics', Arr(S(
            F('name', 'string', '0-7'),
            F('partition_indexes', Arr('int32'), '0-7'),
        )), '0-7', nullable='2-7'),
        F('groups', Arr(S(
            F('group_id', 'string', '8+'),
            F('member_id', 'string', '9+', nullable='9+', default=NULL),
            F('member_epoch', 'int32', '9+', default=-1),
            F('topics', Arr(S(
                F('name', 'string', '8+'),
                F('partition_indexes', Arr('int32'), '8+'),
            )), '8+', nullable='8+'),
        )), '8+'),
        F('require_stable', 'bool', '7+', default=False),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '3+'),
        F('topics', Arr(S(
            F('name', 'string', '0-7'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0-7'),
                F('committed_offset', 'int64', '0-7'),
                F('committed_leader_epoch', 'int32', '5-7', default=-1),
                F('metadata', 'string', '0-7', nullable='0-7'),
                F('error_code', 'int16', '0-7'),
            )), '0-7'),
        )), '0-7'),
        F('error_code', 'int16', '2-7', default=0),
        F('groups', Arr(S(
            F('group_id', 'string', '8+'),
            F('topics', Arr(S(
                F('name', 'string', '8+'),
                F('partitions', Arr(S(
                    F('partition_index', 'int32', '8+'),
                    F('committed_offset', 'int64', '8+'),
                    F('committed_leader_epoch', 'int32', '8+', default=-1),
                    F('metadata', 'string', '8+', nullable='8+'),
                    F('error_code', 'int16', '8+'),
                )), '8+'),
            )), '8+'),
            F('error_code', 'int16', '8+', default=0),
        )), '8+'),
    ),
)

LIST_GROUPS = Api(
    'ListGroups',
    16,
    versions=(0, 5),
    advertised=(0, 5),
    flexible='3+',
    request=S(
        F('states_filter', Arr('string'), '4+'),
        F('types_filter', Arr('string'), '5+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '0+'),
        F('groups', Arr(S(
            F('group_id', 'string', '0+'),
            F('protocol_type', 'string', '0+'),
            F('group_state', 'string', '4+'),
            F('group_type', 'string', '5+'),
        )), '0+'),
    ),
)

DESCRIBE_GROUPS = Api(
    'DescribeGroups',
    15,
    versions=(0, 5),
    advertised=(0, 5),
    flexible='5+',
    request=S(
        F('groups', Arr('string'), '0+'),
        F('include_authorized_operations', 'bool', '3+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('groups', Arr(S(
            F('error_code', 'int16', '0+'),
            F('group_id', 'string', '0+'),
            F('group_state', 'string', '0+'),
            F('protocol_type', 'string', '0+'),
            F('protocol_data', 'string', '0+'),
            F('members', Arr(S(
                F('member_id', 'string', '0+'),
                F('group_instance_id', 'string', '4+', nullable='4+', default=NULL),
                F('client_id', 'string', '0+'),
                F('client_host', 'string', '0+'),
                F('member_metadata', 'bytes', '0+'),
                F('member_assignment', 'bytes', '0+'),
            )), '0+'),
            F('authorized_operations', 'int32', '3+', default=-2147483648),
        )), '0+'),
    ),
)

DELETE_GROUPS = Api(
    'DeleteGroups',
    42,
    versions=(0, 2),
    advertised=(1, 2),
    flexible='2+',
    request=S(
        F('groups_names', Arr('string'), '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('results', Arr(S(
            F('group_id', 'string', '0+'),
            F('error_code', 'int16', '0+'),
        )), '0+'),
    ),
)

CONSUMER_GROUP_HEARTBEAT = Api(
    'ConsumerGroupHeartbeat',
    68,
    versions=(0, 1),
    advertised=(0, 1),
    flexible='0+',
    request=S(
        F('group_id', 'string', '0+'),
        F('member_id', 'string', '0+'),
        F('member_epoch', 'int32', '0+'),
        F('instance_id', 'string', '0+', nullable='0+', default=NULL),
        F('rack_id', 'string', '0+', nullable='0+', default=NULL),
        F('rebalance_timeout_ms', 'int32', '0+', default=-1),
        F('subscribed_topic_names', Arr('string'), '0+', nullable='0+', default=NULL),
        F('subscribed_topic_regex', 'string', '1+', nullable='1+', default=NULL),
        F('server_assignor', 'string', '0+', nullable='0+', default=NULL),
        F('topic_partitions', Arr(S(
            F('topic_id', 'uuid', '0+'),
            F('partitions', Arr('int32'), '0+'),
        )), '0+', nullable='0+', default=NULL),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default=NULL),
        F('member_id', 'string', '0+', nullable='0+', default=NULL),
        F('member_epoch', 'int32', '0+'),
        F('heartbeat_interval_ms', 'int32', '0+'),
        F('assignment', S(
            F('topic_partitions', Arr(S(
                F('topic_id', 'uuid', '0+'),
                F('partitions', Arr('int32'), '0+'),
            )), '0+'),
        ), '0+', nullable='0+', default=NULL),
    ),
)

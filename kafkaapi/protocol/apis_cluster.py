"""Message tables transcribed from Kafka's message schemas by
``python -m kafkaapi.protocol.gen_tables`` (do not edit by hand):
ApiVersions,
Metadata,
DescribeCluster,
SaslHandshake,
SaslAuthenticate.
"""

# fmt: off
from kafkaapi.protocol.schema import NULL, Api, Arr, F, S

__all__ = [
    'API_VERSIONS',
    'DESCRIBE_CLUSTER',
    'METADATA',
    'SASL_AUTHENTICATE',
    'SASL_HANDSHAKE',
]

API_VERSIONS = Api(
    'ApiVersions',
    18,
    versions=(0, 4),
    advertised=(0, 4),
    flexible='3+',
    request=S(
        F('client_software_name', 'string', '3+'),
        F('client_software_version', 'string', '3+'),
    ),
    response=S(
        F('error_code', 'int16', '0+'),
        F('api_keys', Arr(S(
            F('api_key', 'int16', '0+'),
            F('min_version', 'int16', '0+'),
            F('max_version', 'int16', '0+'),
        )), '0+'),
        F('throttle_time_ms', 'int32', '1+'),
        F('supported_features', Arr(S(
            F('name', 'string', '3+'),
            F('min_version', 'int16', '3+'),
            F('max_version', 'int16', '3+'),
        )), '3+', tag=0, tagged='3+'),
        F('finalized_features_epoch', 'int64', '3+', tag=1, tagged='3+', default=-1),
        F('finalized_features', Arr(S(
            F('name', 'string', '3+'),
            F('max_version_level', 'int16', '3+'),
            F('min_version_level', 'int16', '3+'),
        )), '3+', tag=2, tagged='3+'),
        F('zk_migration_ready', 'bool', '3+', tag=3, tagged='3+', default=False),
    ),
)

METADATA = Api(
    'Metadata',
    3,
    versions=(0, 12),
    advertised=(4, 12),
    flexible='9+',
    request=S(
        F('topics', Arr(S(
            F('topic_id', 'uuid', '10+'),
            F('name', 'string', '0+', nullable='10+'),
        )), '0+', nullable='1+'),
        F('allow_auto_topic_creation', 'bool', '4+', default=True),
        F('include_cluster_authorized_operations', 'bool', '8-10'),
        F('include_topic_authorized_operations', 'bool', '8+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '3+'),
        F('brokers', Arr(S(
            F('node_id', 'int32', '0+'),
            F('host', 'string', '0+'),
            F('port', 'int32', '0+'),
            F('rack', 'string', '1+', nullable='1+', default=NULL),
        )), '0+'),
        F('cluster_id', 'string', '2+', nullable='2+', default=NULL),
        F('controller_id', 'int32', '1+', default=-1),
        F('topics', Arr(S(
            F('error_code', 'int16', '0+'),
            F('name', 'string', '0+', nullable='12+'),
            F('topic_id', 'uuid', '10+'),
            F('is_internal', 'bool', '1+', default=False),
            F('partitions', Arr(S(
                F('error_code', 'int16', '0+'),
                F('partition_index', 'int32', '0+'),
                F('leader_id', 'int32', '0+'),
                F('leader_epoch', 'int32', '7+', default=-1),
                F('replica_nodes', Arr('int32'), '0+'),
                F('isr_nodes', Arr('int32'), '0+'),
                F('offline_replicas', Arr('int32'), '5+'),
            )), '0+'),
            F('topic_authorized_operations', 'int32', '8+', default=-2147483648),
        )), '0+'),
        F('cluster_authorized_operations', 'int32', '8-10', default=-2147483648),
    ),
)

DESCRIBE_CLUSTER = Api(
    'DescribeCluster',
    60,
    versions=(0, 1),
    advertised=(0, 1),
    flexible='0+',
    request=S(
        F('include_cluster_authorized_operations', 'bool', '0+'),
        F('endpoint_type', 'int8', '1+', default=1),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default=NULL),
        F('endpoint_type', 'int8', '1+', default=1),
        F('cluster_id', 'string', '0+'),
        F('controller_id', 'int32', '0+', default=-1),
        F('brokers', Arr(S(
            F('broker_id', 'int32', '0+'),
            F('host', 'string', '0+'),
            F('port', 'int32', '0+'),
            F('rack', 'string', '0+', nullable='0+', default=NULL),
        )), '0+'),
        F('cluster_authorized_operations', 'int32', '0+', default=-2147483648),
    ),
)

SASL_HANDSHAKE = Api(
    'SaslHandshake',
    17,
    versions=(0, 1),
    advertised=(1, 1),
    flexible='none',
    request=S(
        F('mechanism', 'string', '0+'),
    ),
    response=S(
        F('error_code', 'int16', '0+'),
        F('mechanisms', Arr('string'), '0+'),
    ),
)

SASL_AUTHENTICATE = Api(
    'SaslAuthenticate',
    36,
    versions=(0, 2),
    advertised=(0, 2),
    flexible='2+',
    request=S(
        F('auth_bytes', 'bytes', '0+'),
    ),
    response=S(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
        F('auth_bytes', 'bytes', '0+'),
        F('session_lifetime_ms', 'int64', '1+', default=0),
    ),
)

"""Message tables transcribed from Kafka's message schemas by
``python -m kafkaapi.protocol.gen_tables`` (do not edit by hand):
CreateTopics,
DeleteTopics,
CreatePartitions,
DescribeConfigs,
IncrementalAlterConfigs.
"""

# fmt: off
from kafkaapi.protocol.schema import NULL, Api, Arr, F, S

__all__ = [
    'CREATE_PARTITIONS',
    'CREATE_TOPICS',
    'DELETE_TOPICS',
    'DESCRIBE_CONFIGS',
    'INCREMENTAL_ALTER_CONFIGS',
]

CREATE_TOPICS = Api(
    'CreateTopics',
    19,
    versions=(0, 7),
    advertised=(2, 7),
    flexible='5+',
    request=S(
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('num_partitions', 'int32', '0+'),
            F('replication_factor', 'int16', '0+'),
            F('assignments', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('broker_ids', Arr('int32'), '0+'),
            )), '0+'),
            F('configs', Arr(S(
                F('name', 'string', '0+'),
                F('value', 'string', '0+', nullable='0+'),
            )), '0+'),
        )), '0+'),
        F('timeout_ms', 'int32', '0+', default=60000),
        F('validate_only', 'bool', '1+', default=False),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '2+'),
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('topic_id', 'uuid', '7+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '1+', nullable='0+'),
            F('topic_config_error_code', 'int16', '5+', tag=0, tagged='5+'),
            F('num_partitions', 'int32', '5+', default=-1),
            F('replication_factor', 'int16', '5+', default=-1),
            F('configs', Arr(S(
                F('name', 'string', '5+'),
                F('value', 'string', '5+', nullable='5+'),
                F('read_only', 'bool', '5+'),
                F('config_source', 'int8', '5+', default=-1),
                F('is_sensitive', 'bool', '5+'),
            )), '5+', nullable='5+'),
        )), '0+'),
    ),
)

DELETE_TOPICS = Api(
    'DeleteTopics',
    20,
    versions=(0, 6),
    advertised=(1, 6),
    flexible='4+',
    request=S(
        F('topics', Arr(S(
            F('name', 'string', '6+', nullable='6+', default=NULL),
            F('topic_id', 'uuid', '6+'),
        )), '6+'),
        F('topic_names', Arr('string'), '0-5'),
        F('timeout_ms', 'int32', '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('responses', Arr(S(
            F('name', 'string', '0+', nullable='6+'),
            F('topic_id', 'uuid', '6+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '5+', nullable='5+', default=NULL),
        )), '0+'),
    ),
)

CREATE_PARTITIONS = Api(
    'CreatePartitions',
    37,
    versions=(0, 3),
    advertised=(0, 3),
    flexible='2+',
    request=S(
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('count', 'int32', '0+'),
            F('assignments', Arr(S(
                F('broker_ids', Arr('int32'), '0+'),
            )), '0+', nullable='0+'),
        )), '0+'),
        F('timeout_ms', 'int32', '0+'),
        F('validate_only', 'bool', '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('results', Arr(S(
            F('name', 'string', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+', default=NULL),
        )), '0+'),
    ),
)

DESCRIBE_CONFIGS = Api(
    'DescribeConfigs',
    32,
    versions=(0, 4),
    advertised=(1, 4),
    flexible='4+',
    request=S(
        F('resources', Arr(S(
            F('resource_type', 'int8', '0+'),
            F('resource_name', 'string', '0+'),
            F('configuration_keys', Arr('string'), '0+', nullable='0+'),
        )), '0+'),
        F('include_synonyms', 'bool', '1+', default=False),
        F('include_documentation', 'bool', '3+', default=False),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('results', Arr(S(
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+'),
            F('resource_type', 'int8', '0+'),
            F('resource_name', 'string', '0+'),
            F('configs', Arr(S(
                F('name', 'string', '0+'),
                F('value', 'string', '0+', nullable='0+'),
                F('read_only', 'bool', '0+'),
                F('is_default', 'bool', '0'),
                F('config_source', 'int8', '1+', default=-1),
                F('is_sensitive', 'bool', '0+'),
                F('synonyms', Arr(S(
                    F('name', 'string', '1+'),
                    F('value', 'string', '1+', nullable='0+'),
                    F('source', 'int8', '1+'),
                )), '1+'),
                F('config_type', 'int8', '3+', default=0),
                F('documentation', 'string', '3+', nullable='0+'),
            )), '0+'),
        )), '0+'),
    ),
)

INCREMENTAL_ALTER_CONFIGS = Api(
    'IncrementalAlterConfigs',
    44,
    versions=(0, 1),
    advertised=(0, 1),
    flexible='1+',
    request=S(
        F('resources', Arr(S(
            F('resource_type', 'int8', '0+'),
            F('resource_name', 'string', '0+'),
            F('configs', Arr(S(
                F('name', 'string', '0+'),
                F('config_operation', 'int8', '0+'),
                F('value', 'string', '0+', nullable='0+'),
            )), '0+'),
        )), '0+'),
        F('validate_only', 'bool', '0+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('responses', Arr(S(
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+'),
            F('resource_type', 'int8', '0+'),
            F('resource_name', 'string', '0+'),
        )), '0+'),
    ),
)

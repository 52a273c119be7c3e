"""Message tables transcribed from Kafka's message schemas by
``python -m kafkaapi.protocol.gen_tables`` (do not edit by hand):
Produce,
Fetch,
ListOffsets,
InitProducerId.
"""

# fmt: off
from kafkaapi.protocol.schema import NULL, Api, Arr, F, S

__all__ = [
    'FETCH',
    'INIT_PRODUCER_ID',
    'LIST_OFFSETS',
    'PRODUCE',
]

PRODUCE = Api(
    'Produce',
    0,
    versions=(0, 11),
    advertised=(7, 11),
    flexible='9+',
    request=S(
        F('transactional_id', 'string', '3+', nullable='3+', default=NULL),
        F('acks', 'int16', '0+'),
        F('timeout_ms', 'int32', '0+'),
        F('topic_data', Arr(S(
            F('name', 'string', '0+'),
            F('partition_data', Arr(S(
                F('index', 'int32', '0+'),
                F('records', 'records', '0+', nullable='0+'),
            )), '0+'),
        )), '0+'),
    ),
    response=S(
        F('responses', Arr(S(
            F('name', 'string', '0+'),
            F('partition_responses', Arr(S(
                F('index', 'int32', '0+'),
                F('error_code', 'int16', '0+'),
                F('base_offset', 'int64', '0+'),
                F('log_append_time_ms', 'int64', '2+', default=-1),
                F('log_start_offset', 'int64', '5+', default=-1),
                F('record_errors', Arr(S(
                    F('batch_index', 'int32', '8+'),
                    F('batch_index_error_message', 'string', '8+', nullable='8+', default=NULL),
                )), '8+'),
                F('error_message', 'string', '8+', nullable='8+', default=NULL),
                F('current_leader', S(
                    F('leader_id', 'int32', '10+', default=-1),
                    F('leader_epoch', 'int32', '10+', default=-1),
                ), '10+', tag=0, tagged='10+'),
            )), '0+'),
        )), '0+'),
        F('throttle_time_ms', 'int32', '1+', default=0),
        F('node_endpoints', Arr(S(
            F('node_id', 'int32', '10+'),
            F('host', 'string', '10+'),
            F('port', 'int32', '10+'),
            F('rack', 'string', '10+', nullable='10+', default=NULL),
        )), '10+', tag=0, tagged='10+'),
    ),
)

FETCH = Api(
    'Fetch',
    1,
    versions=(0, 17),
    advertised=(4, 17),
    flexible='12+',
    request=S(
        F('cluster_id', 'string', '12+', nullable='12+', tag=0, tagged='12+', default=NULL),
        F('replica_id', 'int32', '0-14', default=-1),
        F('replica_state', S(
            F('replica_id', 'int32', '15+', default=-1),
            F('replica_epoch', 'int64', '15+', default=-1),
        ), '15+', tag=1, tagged='15+'),
        F('max_wait_ms', 'int32', '0+'),
        F('min_bytes', 'int32', '0+'),
        F('max_bytes', 'int32', '3+', default=2147483647),
        F('isolation_level', 'int8', '4+', default=0),
        F('session_id', 'int32', '7+', default=0),
        F('session_epoch', 'int32', '7+', default=-1),
        F('topics', Arr(S(
            F('topic', 'string', '0-12'),
            F('topic_id', 'uuid', '13+'),
            F('partitions', Arr(S(
                F('partition', 'int32', '0+'),
                F('current_leader_epoch', 'int32', '9+', default=-1),
                F('fetch_offset', 'int64', '0+'),
                F('last_fetched_epoch', 'int32', '12+', default=-1),
                F('log_start_offset', 'int64', '5+', default=-1),
                F('partition_max_bytes', 'int32', '0+'),
                F('replica_directory_id', 'uuid', '17+', tag=0, tagged='17+'),
            )), '0+'),
        )), '0+'),
        F('forgotten_topics_data', Arr(S(
            F('topic', 'string', '7-12'),
            F('topic_id', 'uuid', '13+'),
            F('partitions', Arr('int32'), '7+'),
        )), '7+'),
        F('rack_id', 'string', '11+', default=''),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '1+'),
        F('error_code', 'int16', '7+'),
        F('session_id', 'int32', '7+', default=0),
        F('responses', Arr(S(
            F('topic', 'string', '0-12'),
            F('topic_id', 'uuid', '13+'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('error_code', 'int16', '0+'),
                F('high_watermark', 'int64', '0+'),
                F('last_stable_offset', 'int64', '4+', default=-1),
                F('log_start_offset', 'int64', '5+', default=-1),
                F('diverging_epoch', S(
                    F('epoch', 'int32', '12+', default=-1),
                    F('end_offset', 'int64', '12+', default=-1),
                ), '12+', tag=0, tagged='12+'),
                F('current_leader', S(
                    F('leader_id', 'int32', '12+', default=-1),
                    F('leader_epoch', 'int32', '12+', default=-1),
                ), '12+', tag=1, tagged='12+'),
                F('snapshot_id', S(
                    F('end_offset', 'int64', '0+', default=-1),
                    F('epoch', 'int32', '0+', default=-1),
                ), '12+', tag=2, tagged='12+'),
                F('aborted_transactions', Arr(S(
                    F('producer_id', 'int64', '4+'),
                    F('first_offset', 'int64', '4+'),
                )), '4+', nullable='4+'),
                F('preferred_read_replica', 'int32', '11+', default=-1),
                F('records', 'records', '0+', nullable='0+'),
            )), '0+'),
        )), '0+'),
        F('node_endpoints', Arr(S(
            F('node_id', 'int32', '16+'),
            F('host', 'string', '16+'),
            F('port', 'int32', '16+'),
            F('rack', 'string', '16+', nullable='16+', default=NULL),
        )), '16+', tag=0, tagged='16+'),
    ),
)

LIST_OFFSETS = Api(
    'ListOffsets',
    2,
    versions=(0, 10),
    advertised=(1, 10),
    flexible='6+',
    request=S(
        F('replica_id', 'int32', '0+'),
        F('isolation_level', 'int8', '2+'),
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('current_leader_epoch', 'int32', '4+', default=-1),
                F('timestamp', 'int64', '0+'),
                F('max_num_offsets', 'int32', '0', default=1),
            )), '0+'),
        )), '0+'),
        F('timeout_ms', 'int32', '10+'),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '2+'),
        F('topics', Arr(S(
            F('name', 'string', '0+'),
            F('partitions', Arr(S(
                F('partition_index', 'int32', '0+'),
                F('error_code', 'int16', '0+'),
                F('old_style_offsets', Arr('int64'), '0'),
                F('timestamp', 'int64', '1+', default=-1),
                F('offset', 'int64', '1+', default=-1),
                F('leader_epoch', 'int32', '4+', default=-1),
            )), '0+'),
        )), '0+'),
    ),
)

INIT_PRODUCER_ID = Api(
    'InitProducerId',
    22,
    versions=(0, 5),
    advertised=(0, 5),
    flexible='2+',
    request=S(
        F('transactional_id', 'string', '0+', nullable='0+'),
        F('transaction_timeout_ms', 'int32', '0+'),
        F('producer_id', 'int64', '3+', default=-1),
        F('producer_epoch', 'int16', '3+', default=-1),
    ),
    response=S(
        F('throttle_time_ms', 'int32', '0+'),
        F('error_code', 'int16', '0+'),
        F('producer_id', 'int64', '0+', default=-1),
        F('producer_epoch', 'int16', '0+'),
    ),
)

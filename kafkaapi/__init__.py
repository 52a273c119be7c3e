"""Kafka's wire protocol front end (issue 25): the codec in ``protocol/`` (sans-I/O), and
later the listener that sits in every write and read proxy over ``serving/``.

Named ``kafkaapi`` rather than ``kafka`` so it never shadows the kafka-python client
(``import kafka``) that tests and tools use (docs/architecture.md, Decisions).
"""

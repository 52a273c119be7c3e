"""Runnable examples of Bookline's delivery guarantees (docs/topics.md): run one with
``python -m examples.<name> --cluster .cluster/cluster.json ...`` against
``bookline local --dir .cluster``. Each is exercised by tests/test_examples.py."""

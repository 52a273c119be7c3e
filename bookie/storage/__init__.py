"""Bookie storage: journal, memtable, entry logs, RocksDB index (see api.py)."""

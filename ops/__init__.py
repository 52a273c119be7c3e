"""Operations: the ``bookline`` command line, the ZooKeeper launcher, child-process
management, the local cluster, benchmarks and (later) the chaos suite.
"""

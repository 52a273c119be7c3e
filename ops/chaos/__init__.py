"""Jepsen-style chaos testing of a Bookline cluster (issue 15): ``bookline chaos``.

Package map (who owns what, and the interfaces between the parts):

* ``checker`` (H4) -- pure: the history of a run (every write attempt, its outcome,
  every read) as JSON lines on disk, and :func:`~ops.chaos.checker.check`, which
  reports ``lost``, ``duplicated``, ``reordered``, ``inconsistent``, ``unexpected``,
  ``failed_present`` (anomalies) and ``recovered`` (allowed). Imports nothing of ours
  but the standard library, so anyone can check a history.
* ``workload`` (H4) -- writer processes (thin client through the write proxies, the
  core library's ``LogWriter``, topic sends, ``TopicProducer``) that record their
  history before each request.
* ``kafka_clients`` (issue 25) -- the ``--workload kafka`` writers: librdkafka
  idempotent producers and consumer-group members (``consumed`` events), and the final
  phase's drain of the group (``group_end`` events).
* ``final`` (H4) -- the final phase: a final write per stream (recovering what killed
  writers left open), then full reads through every read path (read proxy,
  ``LogReader``) and each replica straight from its bookie.
* ``run`` (H4) -- one run: fresh cluster, workload + nemesis for ``duration_s``, heal,
  final reads, check; the summary ``bookline chaos`` prints (``ops/cli/chaos.py``).
* ``netns`` (H5) -- network namespaces, veth links, a bridge and nftables rules.
* ``hosts`` (H5) -- ``ChaosCluster(directory, *, namespaces: bool, seed, auth)`` with
  ``start()``, ``stop()`` (also on failure; by pid; removes its namespaces),
  ``cluster_file`` (a ``cluster.json`` the thin client and core library understand,
  addresses reachable from the root namespace), ``zk_connect``, ``root``,
  ``bookies`` / ``proxies`` / ``zookeepers`` (objects with ``id``, ``address``,
  ``pid``, data directories) and ``skip_reason`` (why namespaces were not used, else
  None).
* ``nemesis`` (H5) -- ``Nemesis(cluster, rng: random.Random)`` with ``async step() ->
  list[Fault]`` (the next step's faults -- one, or an overlap scenario's several --
  started, verified, held and healed: ``kind``, ``target``, times, ``effective`` and its
  ``evidence``), ``async heal_all()``, ``counts()`` (effective faults by kind),
  ``ineffective()`` and ``overlap_stats()``; ``add_target(ProcessTarget(name, current,
  start))`` registers a writer process it may kill and pause (``run`` registers the
  workload's four). ``plans`` (issue 21) chooses the steps from the seed and the
  topology only; ``effects`` looks at whether a fault took effect; ``targets`` holds
  what may be crashed and paused.

All randomness of a run comes from its seed (printed at the start): the nemesis's
``rng``, each writer's choices (``seed`` + writer index + incarnation).
"""

"""The queue: the durable store of executions (layer 7a of docs/architecture.md).

Owns the ``executions`` rows and their status machine (``store``, ``status``, ``models``),
step records (``steps``), the day and period counts (``counters``, ``periods``), the
acceptance of triggered work, the work/finished notices (``notify``) and the API process's
completion hub (``hub``), process heartbeats and the trigger leases that die with them
(``heartbeat``, ``trigger_lease``), and pruning (``pruner``).

May import: the ground floor, ``db``, ``api`` (the kit), ``iam``, ``components`` and the
domains (``flows``, ``logs``, ``secrets``, ``templates``). Never ``executions``,
``runtime``, ``triggers`` or anything above.
"""

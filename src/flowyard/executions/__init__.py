"""Executions: the read API over the queue's rows (layer 7b of docs/architecture.md).

Lists, gets and counts executions and runs a flow by hand (``service``, ``router``,
``schemas``); the rows, their status machine and the counts are written by ``queue/``.

May import: ``queue`` and everything below it. Never ``runtime``, ``triggers`` or above.
"""

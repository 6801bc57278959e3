"""The runtime: where flows run (layer 8 of docs/architecture.md).

Owns the engine's worker loop (claim, dispatch, record: ``worker``), the runner pool
(``pool``), the runner processes that alone run flow code (``runner_process``, ``runner``)
and the IPC between them (``ipc``).

May import: everything up to and including ``queue`` and ``executions``. Never ``triggers``
or the entry layer.
"""

"""Connector components (issue 11): ``sql``, ``amqp``, ``mqtt``, ``redis`` and ``email``.

Each is a component package registered through the ``flowyard.components`` entry
points like the built-ins; they run in the runner processes with the rest of flow
code, take their connection details from the node's credentials (never ``fields``)
and reach their servers only through the outbound network policy
(``flowyard.components.connectors.common.vet_host``). See docs/components.md.
"""

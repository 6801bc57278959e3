"""The components: what a flow's node runs (layer 5 of docs/architecture.md); no database.

Owns the registry (``registry``), the built-ins (``builtins``), the JavaScript step (``code``,
run only in runner processes), the connectors
(``connectors/``), what a component sees (``context``, ``events``), the expression and cron
languages (``expressions``, ``cron``), the outbound network policy (``netpolicy``) and the
registry's HTTP route (``router``, ``GET /components``).

May import: the ground floor, ``api`` (the HTTP kit) and ``iam`` (the caller of
``GET /components``); it owns no table. Never a domain, the queue or anything above.
"""

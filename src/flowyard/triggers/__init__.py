"""The triggers: what starts executions besides a webhook (layer 9 of docs/architecture.md).

Owns the cron scheduler (``scheduler``), the broker consumers (``consumers``), the flow
lifecycle (``lifecycle``: starting and stopping flows) and the ``trigger_leases`` writes
(``leases``: take, renew, mark, release).

May import: everything below, the runtime included. Never the entry layer (``webhooks``,
``app``, ``enginehost``, ...).
"""

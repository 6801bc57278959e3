"""Operator commands that are not the service: backup, restore and check.

No HTTP and no click here: ``flowyard.cli`` registers the commands and turns
``OpsError`` into a clear message and a non-zero exit status.
"""

from __future__ import annotations


class OpsError(Exception):
    """An operator command refused or failed; the message says why and what to do."""

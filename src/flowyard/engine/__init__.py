"""Compatibility only: the import paths third-party components used before issue 16.

``flowyard.engine.components`` and ``flowyard.engine.context`` re-export the component API
from ``flowyard.components``; nothing else lives here and nothing in flowyard imports it.
New code imports ``flowyard.components.registry`` and ``flowyard.components.context``.
"""

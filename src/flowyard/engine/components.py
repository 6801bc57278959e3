"""Compatibility: the component API's old import path (see ``flowyard.components.registry``)."""

from flowyard.components.registry import ENTRY_POINT_GROUP, Component, ComponentFunction, Message, Registry

__all__ = ["ENTRY_POINT_GROUP", "Component", "ComponentFunction", "Message", "Registry"]

"""Compatibility: the step context's old import path (see ``flowyard.components.context``)."""

from flowyard.components.context import Reply, StepContext

__all__ = ["Reply", "StepContext"]

"""Components: what a node runs. Built-ins and third-party ones load alike,
through the entry-point group ``flowyard.components``; the registry is built
once at start-up and then frozen.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from flowyard.components.context import StepContext
    from flowyard.components.events import TriggerFunction

log = logging.getLogger(__name__)

Message = dict[str, Any]
"""``{"data": <json>, "metadata": {...}}``"""

ComponentFunction = Callable[[Message, "StepContext"], Awaitable[Any]]
"""Returns None (no message), one message, or a list of messages."""

ENTRY_POINT_GROUP = "flowyard.components"

# The validation context of a flow being saved (``Component.validate_fields``).
SAVING = {"saving": True}


@dataclass(frozen=True)
class Component:
    id: str
    description: str
    functions: Mapping[str, ComponentFunction]
    default_function: str
    fields: type[BaseModel] | None = None
    trigger: bool = False
    # False for functions that never await (pure transformations): a timeout could
    # not interrupt them anyway, and arming one per call is a measurable cost.
    awaits: bool = True
    function_descriptions: Mapping[str, str] = field(default_factory=dict)
    # Event triggers (triggers/leases.py): function name -> events(ctx) async iterator, driven by
    # the engine while the flow is active. The same name in ``functions`` runs when the
    # execution does (a pass-through of the event's data).
    events: Mapping[str, TriggerFunction] = field(default_factory=dict)
    # A join (SPEC §12): the runner gathers the messages of its incoming edges into sets
    # (runtime/join.py) and calls the function once per complete set, its list as data.
    joins: bool = False

    def __post_init__(self) -> None:
        if self.default_function not in self.functions:
            raise ValueError(
                f"component {self.id}: default function {self.default_function!r} is not defined"
            )
        for name in self.events:
            if name not in self.functions:
                raise ValueError(f"component {self.id}: trigger {name!r} has no function of that name")

    @classmethod
    def single(
        cls,
        id: str,
        description: str,
        function: str,
        run: ComponentFunction,
        fields: type[BaseModel] | None = None,
        *,
        trigger: bool = False,
        awaits: bool = True,
    ) -> Component:
        """A component with one function, which is its default (every built-in)."""
        return cls(
            id=id,
            description=description,
            functions={function: run},
            default_function=function,
            fields=fields,
            trigger=trigger,
            awaits=awaits,
        )

    def fields_schema(self) -> dict[str, Any]:
        if self.fields is None:
            return {"type": "object"}
        return self.fields.model_json_schema()

    def validate_fields(self, raw: Mapping[str, Any], *, saving: bool = True) -> list[tuple[str, str]]:
        """Problems as (relative path, message); ``saving=False`` leaves out the save-only rules."""
        if self.fields is None:
            return []
        try:
            # SAVING: validators may be stricter when a flow is saved than when a stored one is
            # parsed to run (a rule added later must not stop a flow saved before it).
            self.fields.model_validate(raw, context=SAVING if saving else None)
        except ValidationError as exc:
            out = []
            for err in exc.errors():
                path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
                out.append((path, err["msg"]))
            return out
        return []

    def parse_fields(self, raw: Mapping[str, Any]) -> Any:
        return self.fields.model_validate(raw) if self.fields is not None else dict(raw)


class Registry:
    def __init__(
        self, components: Mapping[str, Component], failures: Mapping[str, str] | None = None
    ) -> None:
        self._components = dict(components)
        self.failures = dict(failures or {})

    def get(self, component_id: str) -> Component | None:
        return self._components.get(component_id)

    def __contains__(self, component_id: object) -> bool:
        return component_id in self._components

    def all(self) -> list[Component]:
        return [self._components[k] for k in sorted(self._components)]

    @classmethod
    def load(cls, fallback: Iterable[Component] = ()) -> Registry:
        """Load every entry point of the group; a failing one is logged by name and skipped.
        ``fallback`` (the built-ins, passed by the process that starts): what is offered when no
        entry point is installed (a bare source tree)."""
        found: dict[str, Component] = {}
        failures: dict[str, str] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                component = obj() if callable(obj) and not isinstance(obj, Component) else obj
                if not isinstance(component, Component):
                    raise TypeError(f"{ep.value} is not a flowyard Component")
                if component.id in found:
                    raise ValueError(f"component id {component.id!r} is already registered")
                found[component.id] = component
            except Exception as exc:
                failures[ep.name] = f"{type(exc).__name__}: {exc}"
                log.error("component %s (%s) failed to load: %s", ep.name, ep.value, exc)
        if not found:
            # Running from a source tree without installed metadata: still offer the built-ins.
            found = {c.id: c for c in fallback}
        return cls(found, failures)


# -- the event-trigger node of a graph: one rule for the lifecycle, the consumers and the
# flows service (an active flow keeps its trigger) --------------------------------------------


@dataclass(frozen=True)
class TriggerNode:
    node_id: str
    component: Component
    function: str
    fields: Mapping[str, Any]
    credentials_id: str | None

    @property
    def events(self) -> TriggerFunction:
        return self.component.events[self.function]


class TriggerProblem(ValueError):
    pass


def trigger_node(graph: Mapping[str, Any], registry: Registry) -> TriggerNode | None:
    """The flow's event-trigger node, if it has one (at most one is allowed)."""
    nodes = graph.get("nodes") or []
    targets = {e.get("target") for e in graph.get("edges") or []}
    found: list[TriggerNode] = []
    for node in nodes:
        component = registry.get(node.get("componentId") or "")
        if component is None or not component.events:
            continue
        function = node.get("function") or component.default_function
        if function not in component.events:
            continue
        if node.get("id") in targets:
            raise TriggerProblem(
                f"node {node.get('id')}: the {component.id} {function} trigger has incoming edges"
            )
        found.append(
            TriggerNode(
                node_id=str(node["id"]),
                component=component,
                function=function,
                fields=node.get("fields") or {},
                credentials_id=node.get("credentials_id"),
            )
        )
    if len(found) > 1:
        raise TriggerProblem(
            "a flow may have at most one event trigger: " + ", ".join(n.node_id for n in found)
        )
    return found[0] if found else None

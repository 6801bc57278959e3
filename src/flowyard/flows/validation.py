"""Validation of flow (and template) bodies: every problem of a body is
collected and reported together, each with its JSON path."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flowyard import jsonvalue
from flowyard.components.cron import CronError, validate_cron
from flowyard.components.expressions import ExpressionError, compile_expression, compile_mapper
from flowyard.components.registry import Registry
from flowyard.components.retry import validate_retry
from flowyard.errors import Problem
from flowyard.flows.status import FlowStatus
from flowyard.ids import is_valid_id

FLOW_TYPES = {"ordinary": "ordinary", "realtime": "realtime", "long_running": "realtime"}
OWNER_TYPES = ("user", "tenant")
READ_ONLY = frozenset(
    {
        "id",
        "_id",
        "createdAt",
        "updatedAt",
        "statusMessage",
        "nextRunAt",
        "lastExecutionAt",
        "fromTemplate",
        "webhookSigned",
        "__v",
    }
)
NODE_KEYS = frozenset(
    {"id", "componentId", "credentials_id", "function", "name", "description", "fields", "retry"}
)
EDGE_KEYS = frozenset({"id", "source", "target", "config", "on"})
EDGE_ON = ("success", "failure")
EDGE_CONFIG_KEYS = frozenset({"condition", "mapper"})
MAX_NODES = 1000
MAX_EDGES = 5000
MAX_DEPTH = 64
STATUS_MANUAL = "Flow status cannot be set manually. Use the flow start/stop endpoints instead."


@dataclass
class Checker:
    problems: list[Problem] = field(default_factory=list)
    # False when a stored flow is checked again (at start): rules added after it was saved
    # (``registry.SAVING``) must not stop it.
    saving: bool = True

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(f"{path}: {message}" if path else message, path or None))

    def string(
        self,
        body: dict[str, Any],
        key: str,
        path: str,
        *,
        required: bool,
        max_len: int,
        nonempty: bool = False,
    ) -> str | None:
        value = body.get(key)
        if value is None:
            if required:
                self.add(path, "is required")
            return None
        if not isinstance(value, str):
            self.add(path, "must be a string")
            return None
        if nonempty and not value.strip():
            self.add(path, "must not be empty")
            return None
        if len(value) > max_len:
            self.add(path, f"must be at most {max_len} characters")
            return None
        return value


def json_depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def validate_flow_body(
    body: Any,
    *,
    registry: Registry,
    current_status: str = FlowStatus.INACTIVE,
    template: bool = False,
    saving: bool = True,
) -> tuple[dict[str, Any], list[Problem]]:
    """Check a complete flow (or template) body; returns the normalised form and the problems.
    ``saving=False`` checks a stored flow again (at start) without the save-only rules."""
    c = Checker(saving=saving)
    if not isinstance(body, dict):
        c.add("", "the body must be a JSON object")
        return {}, c.problems
    if json_depth_exceeds(body, MAX_DEPTH):
        c.add("", f"the body is nested more than {MAX_DEPTH} levels deep")
        return {}, c.problems
    # PostgreSQL cannot store U+0000 in text; refuse it everywhere so both databases agree.
    for path in jsonvalue.nul_paths(body):
        c.add(path, "must not contain NUL characters (U+0000)")
    allowed = {"name", "description", "graph", "type", "cron", "owners", "status"}
    allowed |= {"tags", "shared"} if template else {"tenant", "webhookSecret", "errorFlowId"}
    for key in body:
        if key not in allowed and key not in READ_ONLY:
            c.add(key, "is not a known field")
    out: dict[str, Any] = {}
    out["name"] = c.string(body, "name", "name", required=True, max_len=200, nonempty=True)
    out["description"] = c.string(body, "description", "description", required=False, max_len=5000)
    if not template:
        out["tenant"] = c.string(body, "tenant", "tenant", required=False, max_len=64)
        secret = c.string(body, "webhookSecret", "webhookSecret", required=False, max_len=200)
        if secret is not None and len(secret) < 16:
            c.add("webhookSecret", "must be at least 16 characters")
        out["webhookSecret"] = secret
        error_flow = body.get("errorFlowId")
        if error_flow is not None and not (isinstance(error_flow, str) and is_valid_id(error_flow)):
            c.add("errorFlowId", "must be a flow id (24 hex characters) or null")
            error_flow = None
        out["errorFlowId"] = error_flow
    status = body.get("status")
    if template:
        if status is not None and status not in ("published", "draft"):
            c.add("status", "must be published or draft")
        out["status"] = status or "draft"
        tags = body.get("tags")
        if tags is None:
            out["tags"] = []
        elif not isinstance(tags, list) or not all(isinstance(t, str) and 0 < len(t) <= 100 for t in tags):
            c.add("tags", "must be an array of strings of 1 to 100 characters")
        elif len(tags) > 100:
            c.add("tags", "may hold at most 100 tags")
        else:
            out["tags"] = list(dict.fromkeys(tags))
        shared = body.get("shared")
        if shared is not None and not isinstance(shared, bool):
            c.add("shared", "must be true or false")
        out["shared"] = shared is True
    elif status is not None and status != current_status:
        c.add("status", STATUS_MANUAL)
    kind = body.get("type")
    if kind is None:
        c.add("type", "is required")
    elif not isinstance(kind, str) or kind not in FLOW_TYPES:
        c.add("type", "must be ordinary or realtime (long_running is accepted as realtime)")
    else:
        out["type"] = FLOW_TYPES[kind]
    cron = body.get("cron")
    if cron is not None:
        if not isinstance(cron, str):
            c.add("cron", "must be a string")
        else:
            try:
                out["cron"] = validate_cron(cron)
            except CronError as exc:
                c.add("cron", str(exc))
    else:
        out["cron"] = None
    out["owners"] = _owners(c, body.get("owners"))
    out["graph"] = _graph(c, body.get("graph"), registry)
    return out, c.problems


def _owners(c: Checker, owners: Any) -> list[dict[str, str]]:
    if owners is None:
        return []
    if not isinstance(owners, list):
        c.add("owners", "must be an array")
        return []
    out: list[dict[str, str]] = []
    for i, owner in enumerate(owners):
        path = f"owners[{i}]"
        if not isinstance(owner, dict):
            c.add(path, "must be an object with id and type")
            continue
        for key in owner:
            if key not in ("id", "type", "_id"):
                c.add(f"{path}.{key}", "is not a known field")
        oid = c.string(owner, "id", f"{path}.id", required=True, max_len=64, nonempty=True)
        otype = owner.get("type")
        if otype not in OWNER_TYPES:
            c.add(f"{path}.type", "must be user or tenant")
        elif oid is not None and {"id": oid, "type": otype} not in out:
            out.append({"id": oid, "type": otype})
    return out


def _graph(c: Checker, graph: Any, registry: Registry) -> dict[str, Any]:
    if graph is None:
        c.add("graph", "is required")
        return {}
    if not isinstance(graph, dict):
        c.add("graph", "must be an object with nodes and edges")
        return {}
    for key in graph:
        if key not in ("nodes", "edges"):
            c.add(f"graph.{key}", "is not a known field")
    nodes_raw = graph.get("nodes")
    edges_raw = graph.get("edges", [])
    if nodes_raw is None:
        c.add("graph.nodes", "is required")
        nodes_raw = []
    if not isinstance(nodes_raw, list):
        c.add("graph.nodes", "must be an array of nodes")
        nodes_raw = []
    # The seed's samples nest the nodes in one inner array; accept that, store flat.
    if nodes_raw and all(isinstance(n, list) for n in nodes_raw):
        nodes_raw = [n for inner in nodes_raw for n in inner]
    if edges_raw is None:
        edges_raw = []
    if not isinstance(edges_raw, list):
        c.add("graph.edges", "must be an array of edges")
        edges_raw = []
    if not nodes_raw and isinstance(graph.get("nodes"), list):
        c.add("graph.nodes", "must hold at least one node")
    if len(nodes_raw) > MAX_NODES:
        c.add("graph.nodes", f"may hold at most {MAX_NODES} nodes")
        return {}
    if len(edges_raw) > MAX_EDGES:
        c.add("graph.edges", f"may hold at most {MAX_EDGES} edges")
        return {}
    nodes: list[dict[str, Any]] = []
    ids: set[str] = set()
    for i, node in enumerate(nodes_raw):
        nodes.append(_node(c, node, f"graph.nodes[{i}]", ids, registry))
    edges: list[dict[str, Any]] = []
    for i, edge in enumerate(edges_raw):
        e = _edge(c, edge, f"graph.edges[{i}]", ids)
        if e is not None:
            edges.append(e)
    if len(nodes_raw) > 1 and not edges_raw:
        c.add("graph.edges", "a flow with more than one node needs at least one edge")
    if edges and len(edges) == len(edges_raw) and _has_cycle(ids, edges):
        c.add("graph.edges", "the graph must not contain a cycle")
    if len(edges) == len(edges_raw):
        # A join (SPEC §12) gathers what its incoming edges bring: without one it would get the
        # trigger message alone, and wait for nothing else.
        targets = {e.get("target") for e in edges}
        for i, node in enumerate(nodes):
            component = registry.get(node.get("componentId") or "")
            if component is not None and component.joins and node.get("id") not in targets:
                c.add(
                    f"graph.nodes[{i}]", f"a join needs at least one incoming edge (node {node.get('id')!r})"
                )
    return {"nodes": nodes, "edges": edges}


def _node(c: Checker, node: Any, path: str, ids: set[str], registry: Registry) -> dict[str, Any]:
    if not isinstance(node, dict):
        c.add(path, "must be an object")
        return {}
    for key in node:
        if key not in NODE_KEYS:
            c.add(f"{path}.{key}", "is not a known field")
    out: dict[str, Any] = {}
    nid = c.string(node, "id", f"{path}.id", required=True, max_len=64, nonempty=True)
    if nid is not None:
        if nid in ids:
            c.add(f"{path}.id", f"duplicates node id {nid!r}")
        ids.add(nid)
        out["id"] = nid
    component_id = c.string(node, "componentId", f"{path}.componentId", required=False, max_len=200)
    function = c.string(node, "function", f"{path}.function", required=False, max_len=200)
    for key, max_len in (("name", 200), ("description", 5000), ("credentials_id", 64)):
        value = c.string(node, key, f"{path}.{key}", required=False, max_len=max_len)
        if value is not None:
            out[key] = value
    fields = node.get("fields")
    if fields is not None and not isinstance(fields, dict):
        c.add(f"{path}.fields", "must be an object")
        fields = None
    component = None
    if component_id is not None:
        component = registry.get(component_id)
        if component is None:
            c.add(f"{path}.componentId", f"no installed component {component_id!r}")
        out["componentId"] = component_id
    if function is not None:
        if component is not None and function not in component.functions:
            c.add(
                f"{path}.function",
                f"component {component_id!r} has no function {function!r}; "
                f"it has {', '.join(sorted(component.functions))}",
            )
        elif component is None and component_id is None:
            c.add(f"{path}.function", "needs a componentId")
        out["function"] = function
    if component is not None:
        for sub, message in component.validate_fields(fields or {}, saving=c.saving):
            c.add(f"{path}.fields{sub}", f"{message} (node {nid!r})" if nid else message)
    if fields is not None:
        out["fields"] = fields
    retry = node.get("retry")
    if retry is not None:  # SPEC §11
        problems = validate_retry(retry)
        for sub, message in problems:
            c.add(f"{path}.retry{sub}", f"{message} (node {nid!r})" if nid else message)
        if not problems:
            out["retry"] = retry
    return out


def validate_node(
    node: Any, *, registry: Registry, path: str = "node"
) -> tuple[dict[str, Any], list[Problem]]:
    """One node, by the same rules as a node of a saved graph (a step tested alone)."""
    c = Checker()
    if json_depth_exceeds(node, MAX_DEPTH):
        c.add(path, f"is nested more than {MAX_DEPTH} levels deep")
        return {}, c.problems
    return _node(c, node, path, set(), registry), c.problems


def _edge(c: Checker, edge: Any, path: str, ids: set[str]) -> dict[str, Any] | None:
    if not isinstance(edge, dict):
        c.add(path, "must be an object")
        return None
    ok = True
    for key in edge:
        if key not in EDGE_KEYS:
            c.add(f"{path}.{key}", "is not a known field")
    out: dict[str, Any] = {}
    eid = c.string(edge, "id", f"{path}.id", required=False, max_len=64)
    if eid is not None:
        out["id"] = eid
    for end in ("source", "target"):
        value = c.string(edge, end, f"{path}.{end}", required=True, max_len=64)
        if value is None:
            ok = False
        elif value not in ids:
            c.add(f"{path}.{end}", f"names no node of this flow ({value!r})")
            ok = False
        else:
            out[end] = value
    on = edge.get("on")
    if on is not None:  # SPEC §11: a failure edge is taken when its source failed for good
        if on not in EDGE_ON:
            c.add(f"{path}.on", 'must be "success" or "failure"')
        elif on == "failure":
            out["on"] = on
    config = edge.get("config")
    if config is not None:
        if not isinstance(config, dict):
            c.add(f"{path}.config", "must be an object")
        else:
            for key in config:
                if key not in EDGE_CONFIG_KEYS:
                    c.add(f"{path}.config.{key}", "is not a known field (condition, mapper)")
            cond = config.get("condition")
            if cond is not None:
                if not isinstance(cond, str) or not cond.strip():
                    c.add(f"{path}.config.condition", "must be a non-empty JSONata string")
                else:
                    try:
                        compile_expression(cond)
                    except ExpressionError as exc:
                        c.add(f"{path}.config.condition", str(exc))
            mapper = config.get("mapper")
            if mapper is not None:
                if not isinstance(mapper, dict):
                    c.add(f"{path}.config.mapper", "must be an object whose leaves are JSONata expressions")
                else:
                    try:
                        compile_mapper(mapper)
                    except ExpressionError as exc:
                        c.add(f"{path}.config.mapper", str(exc))
            out["config"] = {k: config[k] for k in EDGE_CONFIG_KEYS if config.get(k) is not None}
    return out if ok else None


def _has_cycle(ids: set[str], edges: list[dict[str, Any]]) -> bool:
    indeg = dict.fromkeys(ids, 0)
    succ: dict[str, list[str]] = {n: [] for n in ids}
    for e in edges:
        succ[e["source"]].append(e["target"])
        indeg[e["target"]] += 1
    queue = deque(n for n, d in indeg.items() if d == 0)
    seen = 0
    while queue:
        n = queue.popleft()
        seen += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    return seen != len(ids)

"""Portable flows (SPEC §12): the document ``GET /flows/{id}/export`` answers and
``POST /flows/import`` (and ``flowyard flows export|import``) takes.

A document is the flow without ids, owners, tenant, status or secrets::

    {"flowyard": 1, "name": ..., "description": ..., "type": ..., "cron": ..., "graph": ...}

A node's credentials are named (``credentials_name``), never given by id nor by value; on
import each name must match exactly one secret the importer's new flow may use. A webhook
secret is never exported and refused on import. Permissions are decided in flows/service.py.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import jsonvalue
from flowyard.errors import Problem
from flowyard.flows import validation
from flowyard.flows.models import Flow
from flowyard.secrets import service as secrets

FORMAT = 1
# A flow's document is small: 500 nodes of ordinary fields fit in far less. Bigger, or deeper
# than a flow body may nest, and it is refused before anything else is looked at.
MAX_DOCUMENT_BYTES = 512 * 1024
MAX_DEPTH = validation.MAX_DEPTH
KEYS = ("flowyard", "name", "description", "type", "cron", "graph")
# Top-level fields of a stored flow that a document never carries.
_NOT_PORTABLE = {
    "id",
    "_id",
    "owners",
    "tenant",
    "status",
    "statusMessage",
    "createdAt",
    "updatedAt",
    "nextRunAt",
    "lastExecutionAt",
    "fromTemplate",
    "webhookSigned",
    "version",
    "errorFlowId",
}
_SECRET_KEYS = {"webhookSecret", "webhook_secret", "secret", "secrets", "credentials", "password", "token"}
_NODE_SECRET_KEYS = {"credentials", "credentials_value", "credentialsValue", "secret", "secrets"}


def _nodes(graph: Any) -> list[Any]:
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    if not isinstance(nodes, list):
        return []
    if nodes and all(isinstance(n, list) for n in nodes):  # the seed's nested form
        return [n for inner in nodes for n in inner]
    return nodes


async def export_document(session: AsyncSession, flow: Flow) -> dict[str, Any]:
    """The document of a stored flow: credentials named, no secret, no id."""
    graph = copy.deepcopy(flow.graph)
    nodes = _nodes(graph)
    names = await secrets.names_of(
        session, [n["credentials_id"] for n in nodes if isinstance(n, dict) and n.get("credentials_id")]
    )
    for node in nodes:
        if isinstance(node, dict) and "credentials_id" in node:
            cid = node.pop("credentials_id")
            if cid in names:
                node["credentials_name"] = names[cid]
    graph["nodes"] = nodes
    return {
        "flowyard": FORMAT,
        "name": flow.name,
        "description": flow.description,
        "type": flow.type,
        "cron": flow.cron,
        "graph": graph,
    }


def parse(raw: bytes | str) -> tuple[Any, list[Problem]]:
    """The document as JSON, or why it cannot be read (size and depth first: a hostile document
    costs nothing more)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_DOCUMENT_BYTES:
        return None, [
            Problem(f"The document is {len(data)} bytes; at most {MAX_DOCUMENT_BYTES} are allowed.")
        ]
    try:
        doc = jsonvalue.loads(data)
    except jsonvalue.TooDeep as exc:
        return None, [Problem(f"The document {exc}.")]
    except orjson.JSONDecodeError as exc:
        return None, [Problem(f"The document is not valid JSON: {exc}")]
    if jsonvalue.depth_exceeds(doc, MAX_DEPTH):
        return None, [Problem(f"The document nests deeper than {MAX_DEPTH} levels of arrays and objects.")]
    return doc, []


def to_body(doc: Any) -> tuple[dict[str, Any], dict[int, str], list[Problem]]:
    """A create body (``flows.validation`` checks it next) from a document, the credential name
    of each node (by index), and the document's own problems: fields a document never carries,
    a secret smuggled in, credentials given by id or by value."""
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        return {}, {}, [Problem("The document must be a JSON object.")]
    if jsonvalue.depth_exceeds(doc, MAX_DEPTH):
        return {}, {}, [Problem(f"The document nests deeper than {MAX_DEPTH} levels of arrays and objects.")]
    for key in doc:
        if key in _SECRET_KEYS:
            problems.append(
                Problem(f"{key}: a secret is never imported; set it on the flow after the import.", key)
            )
        elif key in _NOT_PORTABLE:
            problems.append(Problem(f"{key}: is not part of a portable flow document.", key))
        elif key not in KEYS:
            problems.append(Problem(f"{key}: is not a known field.", key))
    fmt = doc.get("flowyard", FORMAT)
    if fmt != FORMAT or isinstance(fmt, bool):
        problems.append(
            Problem(f"flowyard: this installation reads documents of format {FORMAT}.", "flowyard")
        )
    body = {k: doc[k] for k in ("name", "description", "type", "cron") if k in doc}
    graph = doc.get("graph")
    names: dict[int, str] = {}
    if isinstance(graph, dict):
        graph = dict(graph)
        nodes = []
        for i, node in enumerate(_nodes(graph)):
            path = f"graph.nodes[{i}]"
            if isinstance(node, dict):
                node = dict(node)
                for key in sorted(_NODE_SECRET_KEYS & node.keys()):
                    problems.append(
                        Problem(
                            f"{path}.{key}: credential values are never imported; name a stored "
                            "secret with credentials_name.",
                            f"{path}.{key}",
                        )
                    )
                    node.pop(key)
                if "credentials_id" in node:
                    problems.append(
                        Problem(
                            f"{path}.credentials_id: a document names its credentials (credentials_name), "
                            "ids differ between installations.",
                            f"{path}.credentials_id",
                        )
                    )
                    node.pop("credentials_id")
                if "credentials_name" in node:
                    name = node.pop("credentials_name")
                    if not isinstance(name, str) or not 0 < len(name) <= 200:
                        problems.append(
                            Problem(
                                f"{path}.credentials_name: must be a secret's name.",
                                f"{path}.credentials_name",
                            )
                        )
                    else:
                        names[i] = name
            nodes.append(node)
        if "nodes" in graph:
            graph["nodes"] = nodes
        body["graph"] = graph
    elif "graph" in doc:
        body["graph"] = graph
    return body, names, problems


async def resolve_names(
    session: AsyncSession, names: dict[int, str], *, tenant: str | None, owner_user: str | None
) -> tuple[dict[int, str], list[Problem]]:
    """The secret id for each node's credential name, as usable by the importer's new flow;
    a name with no usable secret (or with several) is a problem."""
    found = await secrets.usable_by_name(session, names.values(), tenant=tenant, owner_user=owner_user)
    ids: dict[int, str] = {}
    problems: list[Problem] = []
    for i, name in sorted(names.items()):
        path = f"graph.nodes[{i}].credentials_name"
        match found.get(name, []):
            case [one]:
                ids[i] = one
            case []:
                problems.append(
                    Problem(f"{path}: credentials {name!r} are missing here: create them first.", path)
                )
            case _:
                problems.append(
                    Problem(f"{path}: several credentials are named {name!r}; rename all but one.", path)
                )
    return ids, problems

"""HTTP for trial runs: test one step of a flow on a sample message."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from flowyard.api.deps import DB, json_body_doc, read_json
from flowyard.api.docs import errors
from flowyard.api.responses import JSONOut, Single, single
from flowyard.errors import InvalidInput, Problem
from flowyard.flows.service import check_id
from flowyard.iam.deps import Caller
from flowyard.trials import service
from flowyard.trials.schemas import StepTrialOutcome

router = APIRouter(tags=["flows"])


@router.post(
    "/flows/{id}/test-step",
    response_model=Single[StepTrialOutcome],
    responses=errors(400, 401, 403, 404, 413, 415, 429),
    openapi_extra=json_body_doc("StepTrial"),
    summary="Run one node alone on a sample message, in a runner, and answer what it emitted or "
    "its error; nothing is stored (tenant.flows.update)",
)
async def test_step(
    id: Annotated[str, Path(description="Flow id: 24 hex characters.")],
    request: Request,
    db: DB,
    caller: Caller,
) -> JSONOut:
    check_id(id)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidInput("The body must be a JSON object with node and data.")
    unknown = [Problem(f"{key}: is not a known field", key) for key in body if key not in ("node", "data")]
    if unknown:
        raise InvalidInput(unknown)
    async with db.read() as session:
        spec, claimed = await service.prepare(
            session,
            caller,
            id,
            body.get("node"),
            body.get("data"),
            registry=request.app.state.registry,
            box=request.app.state.secret_box,
        )
    node_id = spec.nodes[-1][0]
    return single(await request.app.state.trials.run(spec, claimed, node_id))

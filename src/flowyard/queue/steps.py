"""An execution's step results: one JSON document on the execution row (``executions.steps``),
stored in the shape ``GET /executions/{id}`` serves (SPEC §6), so recording an outcome is one
UPDATE per execution and reading it needs no reshaping. The only place that shape is made."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from flowyard.clock import isoformat
from flowyard.queue.records import StepRecord


def document(steps: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """The stored and served steps, in the order their nodes first ran."""
    return [
        {
            "nodeId": s.node_id,
            "componentId": s.component_id,
            "function": s.function,
            "status": s.status,
            "runs": s.runs,
            "messagesIn": s.messages_in,
            "messagesOut": s.messages_out,
            "durationMs": s.duration_ms,
            "startedAt": isoformat(s.started_at),
            "finishedAt": isoformat(s.finished_at),
            "error": s.error,
            "output": s.output,
            "attempts": s.attempts,
            "attemptErrors": s.attempt_errors,
            **({"input": s.input} if s.input is not None else {}),
            **({"inputs": s.inputs} if s.inputs is not None else {}),
        }
        for s in sorted(steps, key=lambda s: s.position)
    ]


def record(doc: dict[str, Any], position: int) -> StepRecord:
    """A stored step (served shape) back as a record: the steps a continuation carries over
    (``queue/continuation.py``) join the outcome of the execution that goes on from it."""
    return StepRecord(
        node_id=doc["nodeId"],
        component_id=doc.get("componentId"),
        function=doc.get("function"),
        status=doc.get("status", "succeeded"),
        runs=int(doc.get("runs", 0)),
        messages_in=int(doc.get("messagesIn", 0)),
        messages_out=int(doc.get("messagesOut", 0)),
        duration_ms=float(doc.get("durationMs", 0.0)),
        started_at=datetime.fromisoformat(doc["startedAt"]),
        finished_at=datetime.fromisoformat(doc["finishedAt"]),
        error=doc.get("error"),
        output=doc.get("output"),
        position=position,
        attempts=int(doc.get("attempts", doc.get("runs", 1))),
        attempt_errors=list(doc.get("attemptErrors") or []),
        input=doc.get("input"),
        inputs=doc.get("inputs"),
    )

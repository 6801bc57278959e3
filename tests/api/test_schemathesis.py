"""Property-based run of schemathesis against the app's own OpenAPI document:
as an administrator, over ASGI, on SQLite. No 5xx, and every response must
conform to what the document says (status codes, content types, schemas)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

from flowyard.app import create_app
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.flows import service as flows_service
from flowyard.iam import service as iam
from flowyard.iam.principal import Principal
from tests.conftest import flow_body

MAX_EXAMPLES = int(os.environ.get("FLOWYARD_SCHEMATHESIS_EXAMPLES", "25"))


async def _make_admin(url: str) -> str:
    db = Database(url)
    try:
        async with db.write() as session:
            user = await iam.create_user(
                session,
                username="admin@example.com",
                password="correct horse battery",
                firstname="Ad",
                lastname="Min",
                tenant_id=None,
                permissions=["all"],
            )
            principal = Principal(user.id, user.username, None, frozenset({"all"}), "")
            _token, text = await iam.create_api_token(
                session, principal, description="schemathesis", expires_at=None, permissions=None
            )
            # Something for the listing and its response schema to be checked against.
            registry = Registry.load()
            flows = [
                flows_service.prepare_new_flow(principal, flow_body(f"seeded {i}", cron=cron), registry)
                for i, cron in enumerate([None, "*/5 * * * *", None])
            ]
            await flows_service.insert_flows(session, flows)
            flows[0].status = "active"
        return text
    finally:
        await db.dispose()


@pytest.fixture(scope="module")
def admin_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    data_dir: Path = tmp_path_factory.mktemp("schemathesis")
    url = f"sqlite+aiosqlite:///{data_dir / 'flowyard.db'}"
    migrate.upgrade(url)
    token = asyncio.run(_make_admin(url))
    # The app owns its Database (made by its lifespan, inside schemathesis' event loop).
    app = create_app(Settings(data_dir=data_dir, database_url=url), run_engine=False)
    yield token, app


# Every check except positive_data_acceptance: the API validates more than JSON Schema can
# say (graph cycles, known components, cron syntax, future expiry dates), so a schema-valid
# body may rightly get a 400.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]


def test_api_conforms_to_its_openapi(admin_token: tuple[str, Any]) -> None:
    token, app = admin_token
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # Unknown query parameters (other than filter[...] and page[...]) are ignored, as most
    # HTTP APIs do; an extra parameter is not a schema violation we promise to refuse.
    schema.config.generation.update(allow_extra_parameters=False)
    headers = {"Authorization": f"Bearer {token}"}
    failures: dict[str, str] = {}
    tested = 0
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]
        # Logging out would revoke the token every later case authenticates with.
        if operation.path == "/logout":
            continue
        tested += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                case.call_and_validate(headers=headers, checks=CHECKS)

            try:
                run()
            except Unsatisfiable:
                # Nothing to get wrong: an operation without parameters or body has no negative cases.
                assert mode is GenerationMode.NEGATIVE
            except Exception as exc:
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:3000]
    assert tested > 10
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())

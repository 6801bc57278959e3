"""The OpenAPI document is usable, not only valid: a typed client generated from it at test
time (openapi-python-client) drives the README's journey against a real ``flowyard serve``
on SQLite and PostgreSQL: log in, create a flow, start it, post a webhook, read the
execution and the flow's logs. Every call goes through the generated functions and models."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowyard.app import create_app
from flowyard.config import Settings
from tests.conftest import flow_body
from tests.contract.serve import ADMIN, Server, bin_path

pytestmark = [pytest.mark.slow]
PACKAGE = "flowyard_generated_client"


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The client package, generated from the document the app serves."""
    root = tmp_path_factory.mktemp("client")
    app = create_app(Settings(data_dir=root / "data"), run_engine=False)
    (root / "openapi.json").write_text(json.dumps(app.openapi()))  # as served: int keys as text
    cmd = [
        bin_path("openapi-python-client"),
        "generate",
        "--path",
        str(root / "openapi.json"),
        "--output-path",
        str(root / PACKAGE),
        "--meta",
        "none",
    ]
    env_path = str(Path(sys.executable).parent)
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={"PATH": env_path, "HOME": str(root)}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _api(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.{name}")


def _model(name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def _until(what: str, probe: Callable[[], Any], within: float = 90.0) -> Any:
    """Poll ``probe`` until it returns something truthy (a liveness bound, not a timing test)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_readme_journey(gen: Any, server: Server) -> None:
    anonymous = gen.Client(base_url=server.base, raise_on_unexpected_status=True, timeout=30)
    login = _api("auth.login_login_post")
    token = login.sync(client=anonymous, body=_model("Login")(username=ADMIN[0], password=ADMIN[1]))
    assert isinstance(token, _model("AccessToken")), token
    client = gen.AuthenticatedClient(
        base_url=server.base, token=token.token, raise_on_unexpected_status=True, timeout=30
    )

    # A wrong password is an ErrorResponse in the documented shape, not an exception.
    refused = login.sync_detailed(
        client=anonymous, body=_model("Login")(username=ADMIN[0], password="wrong one")
    )
    assert refused.status_code == 401
    assert isinstance(refused.parsed, _model("ErrorResponse"))

    created = _api("flows.create_flow_flows_post").sync(
        client=client, body=_model("MutableFlow").from_dict(flow_body("journey"))
    )
    assert isinstance(created, _model("SingleFlow")), created
    flow = created.data
    assert flow.name == "journey" and flow.status.value == "inactive"

    started = _api("flows.start_flow_flows_id_start_post").sync(flow.id, client=client)
    assert isinstance(started, _model("SingleFlowStatusChange")), started

    get_flow = _api("flows.get_flow_flows_id_get")
    _until(
        "the flow to be active", lambda: get_flow.sync(flow.id, client=client).data.status.value == "active"
    )

    hook = _api("webhooks.receive_webhooks_flow_id_post").sync_detailed(
        flow.id, client=anonymous, body={"order": 42}
    )
    assert hook.status_code == 202, hook.content
    execution_id = hook.parsed.data.execution_id

    get_execution = _api("executions.get_execution_executions_id_get")

    def finished() -> Any:
        detail = get_execution.sync(execution_id, client=client)
        assert isinstance(detail, _model("SingleExecutionDetail")), detail
        return detail.data if detail.data.status.value in ("succeeded", "failed") else None

    execution = _until("the execution to finish", finished)
    assert execution.status.value == "succeeded", execution.error
    assert execution.flow_id == flow.id
    assert execution.input_ == {"order": 42}

    listed = _api("executions.list_executions_executions_get").sync(client=client, filterflow_id=flow.id)
    assert [e.id for e in listed.data] == [execution_id]

    owner = next(o.id for o in flow.owners if o.type_.value == "user")
    get_logs = _api("logs.get_logs_logs_get")

    def logged() -> Any:
        page = get_logs.sync(client=client, filtertenant=owner, filterflow_id=flow.id)
        assert isinstance(page, _model("PageLogEntryOut")), page
        return page.data

    entries = _until("the flow's log entry", logged)
    assert {e.flow_id for e in entries} == {flow.id}
    assert {e.execution_id for e in entries} == {execution_id}

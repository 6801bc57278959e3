"""``flowyard flows export|import`` as real subprocesses against a temporary SQLite data dir:
a folder of documents round-trips, and a folder with one bad document imports nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import _env, run
from tests.conftest import flow_body

pytestmark = pytest.mark.slow


def test_export_and_import_a_folder(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    run("migrate", env=env)
    run("tenants", "create", "Acme", env=env)
    run(
        "users",
        "create",
        "--username",
        "ops@acme.example",
        "--password",
        "long enough pw",
        "--tenant",
        "Acme",
        env=env,
    )
    src = tmp_path / "src"
    src.mkdir()
    for name in ("Order sync", "Invoice push"):
        doc = {k: v for k, v in flow_body(name).items()}
        (src / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")
    lines = run("flows", "import", str(src), "--as", "ops@acme.example", env=env).stdout.split("\n")
    ids = [line.split()[0] for line in lines if line.strip()]
    assert len(ids) == 2 and all(len(i) == 24 for i in ids)

    out = tmp_path / "repo"
    written = run(
        "flows", "export", *ids, "--out", str(out), "--as", "ops@acme.example", env=env
    ).stdout.split()
    assert sorted(Path(p).name for p in written) == ["invoice-push.json", "order-sync.json"]
    doc = json.loads((out / "order-sync.json").read_text(encoding="utf-8"))
    assert doc["name"] == "Order sync" and "id" not in doc and "owners" not in doc
    single = run("flows", "export", ids[0], "--as", "ops@acme.example", env=env).stdout
    assert json.loads(single)["flowyard"] == 1

    # One bad document in the folder: every problem printed, nothing imported.
    (out / "zz-bad.json").write_text(
        json.dumps({**doc, "webhookSecret": "0123456789abcdef0123", "graph": {"nodes": []}}), encoding="utf-8"
    )
    proc = run("flows", "import", str(out), "--as", "ops@acme.example", env=env, ok=False)
    assert proc.returncode != 0
    assert "nothing was imported" in proc.stderr and "webhookSecret" in proc.stderr
    assert "graph.nodes" in proc.stderr and "0123456789abcdef0123" not in proc.stderr
    (out / "zz-bad.json").unlink()
    again = run("flows", "import", str(out), "--as", "ops@acme.example", env=env).stdout.split("\n")
    assert len([line for line in again if line.strip()]) == 2
    # Another tenant's member cannot export the flows (not visible: not found).
    run("tenants", "create", "Other", env=env)
    run(
        "users",
        "create",
        "--username",
        "other@example.com",
        "--password",
        "long enough pw",
        "--tenant",
        "Other",
        env=env,
    )
    proc = run("flows", "export", ids[0], "--as", "other@example.com", env=env, ok=False)
    assert proc.returncode != 0 and "not found" in proc.stderr

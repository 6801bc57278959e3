"""Issue 17: a flow's webhook secret is stored sealed with the service's key and never returned
after it is set; the embedded database and its directory are readable by the service's user
only (0600 files, a 0700 directory), whoever creates them first."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.secrets.crypto import SecretBox, load_key
from flowyard.webhooks.signature import signature_header
from tests.conftest import Account, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow


async def _stored_secret(db: Database, fid: str) -> str | None:
    async with db.read() as session:
        return await session.scalar(sa.text("SELECT webhook_secret FROM flows WHERE id = :i"), {"i": fid})


async def test_webhook_secret_is_stored_sealed_and_never_returned(
    engine_client: httpx.AsyncClient, admin: Account, db: Database, engine_settings: Settings
) -> None:
    c = engine_client
    secret = "s3cret-at-rest-0001"
    r = await c.post("/flows", json=flow_body(webhookSecret=secret), headers=admin.headers)
    assert r.status_code == 201 and secret not in r.text, r.text
    fid = r.json()["data"]["id"]
    box = SecretBox(load_key(engine_settings.configured_secret_key(), engine_settings.data_dir))
    sealed = await _stored_secret(db, fid)
    assert sealed is not None and secret not in sealed and box.open(sealed) == secret
    for url in (f"/flows/{fid}", "/flows"):
        got = await c.get(url, headers=admin.headers)
        assert got.status_code == 200 and secret not in got.text and sealed not in got.text
    # A new secret through PATCH is sealed too, and the webhook door checks against it.
    rotated = "r0tated-secret-0002"
    r = await c.patch(f"/flows/{fid}", json={"webhookSecret": rotated}, headers=admin.headers)
    assert r.status_code == 200 and rotated not in r.text and r.json()["data"]["webhookSigned"] is True
    resealed = await _stored_secret(db, fid)
    assert resealed is not None and rotated not in resealed and box.open(resealed) == rotated
    await c.post(f"/flows/{fid}/start", headers=admin.headers)
    fid2 = await active_flow(c, admin, flow_body(name="signed", webhookSecret=secret))
    body = b'{"a": 1}'
    for flow_id, good, bad in ((fid2, secret, rotated), (fid, rotated, secret)):
        if flow_id == fid:
            await active_flow_wait(c, admin, fid)
        now = int(time.time())
        headers = {"Content-Type": "application/json"}
        wrong = await c.post(
            f"/webhooks/{flow_id}",
            content=body,
            headers={**headers, "X-Flowyard-Signature": signature_header(bad, body, now)},
        )
        assert wrong.status_code == 401
        right = await c.post(
            f"/webhooks/{flow_id}",
            content=body,
            headers={**headers, "X-Flowyard-Signature": signature_header(good, body, now)},
        )
        assert right.status_code == 202, right.text


async def active_flow_wait(c: httpx.AsyncClient, who: Account, fid: str) -> None:
    async def active() -> bool:
        return (await c.get(f"/flows/{fid}", headers=who.headers)).json()["data"]["status"] == "active"

    await wait_until(active)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_database_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        data = tmp_path / "fresh" / "data"
        url = f"sqlite+aiosqlite:///{data / 'flowyard.db'}"
        await migrate.upgrade_async(url)  # `flowyard migrate` / `serve` create it first
        assert _mode(data) == 0o700 and _mode(data / "flowyard.db") == 0o600
        db = Database(url)
        try:
            async with db.write() as session:
                await session.execute(sa.text("CREATE TABLE IF NOT EXISTS t (x)"))
                await session.execute(sa.text("INSERT INTO t VALUES (1)"))
            files = sorted(p.name for p in data.iterdir())
            assert "flowyard.db-wal" in files, files
            for name in files:
                assert _mode(data / name) == 0o600, (name, oct(_mode(data / name)))
        finally:
            await db.dispose()
        # A database an older flowyard created 0644 is made private when opened.
        (data / "flowyard.db").chmod(0o644)
        db = Database(url)
        await db.dispose()
        assert _mode(data / "flowyard.db") == 0o600
        # The key file's directory, when load_key creates it.
        load_key(None, tmp_path / "keys")
        assert _mode(tmp_path / "keys") == 0o700 and _mode(tmp_path / "keys" / "secret.key") == 0o600
    finally:
        os.umask(old)

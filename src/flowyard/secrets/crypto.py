"""The key that encrypts stored secrets.

``FLOWYARD_SECRET_KEY`` (a Fernet key) wins; without it the embedded default
creates ``<data_dir>/secret.key`` (mode 0600) once. Every process of a
scale-out deployment must see the same key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from cryptography.fernet import Fernet, InvalidToken


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def seal(self, value: Any) -> str:
        return self._fernet.encrypt(orjson.dumps(value)).decode()

    def open(self, token: str) -> Any:
        try:
            return orjson.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            raise ValueError(
                "cannot decrypt: FLOWYARD_SECRET_KEY differs from the key it was stored with"
            ) from None


def load_key(configured: str | None, data_dir: Path) -> bytes:
    if configured:
        return configured.encode()
    path = data_dir / "secret.key"
    if path.exists():
        return path.read_bytes().strip()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Fernet.generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of this data dir won the race
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key

"""Secret schemas: the value goes in, never out."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowyard.clock import Timestamp


class SecretCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    value: dict[str, Any] = Field(
        description="Handed to components as their credentials, e.g. {token} (Bearer), {username, password} "
        "(Basic) or {headers} for the http component. Write-only."
    )
    tenant: str | None = Field(None, description="Administrators only; default: the caller's tenant.")


class SecretRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: dict[str, Any] = Field(description="The new value (write-only); the secret keeps its id and name.")


class SecretOut(BaseModel):
    id: str
    name: str
    tenant: str | None = None
    owner: str
    createdAt: Timestamp
    updatedAt: Timestamp

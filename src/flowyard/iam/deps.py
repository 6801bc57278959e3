"""The caller of a request as a FastAPI dependency: the bearer token resolved to a ``Principal``
(through the process's principal cache), a sliding session renewed on use. Routers take
``Caller``; the HTTP kit (``flowyard.api``) stays free of identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flowyard.db.session import Database
from flowyard.errors import Unauthorized
from flowyard.iam import tokens
from flowyard.iam.cache import PrincipalCache
from flowyard.iam.principal import Principal
from flowyard.iam.tokens import Lifetimes

_bearer = HTTPBearer(auto_error=False, description="A token from POST /login or POST /tokens.")


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("Authorization: Bearer <token> is required.")
    cache: PrincipalCache = request.app.state.principals
    key = tokens.hash_token(credentials.credentials)
    cached = cache.get(key)
    if cached is not None:
        return cached
    db: Database = request.app.state.db
    lifetimes = Lifetimes.of(request.app.state.settings)
    resolved = await tokens.authenticate(db, credentials.credentials, lifetimes)
    principal = resolved.principal
    cache.put(key, principal, until=resolved.valid_until)
    if resolved.slide:
        async with db.write() as session:
            await tokens.slide_session(session, principal.token_id, lifetimes)
    return principal


Caller = Annotated[Principal, Depends(get_principal)]

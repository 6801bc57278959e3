"""Who is calling, with what permissions."""

from __future__ import annotations

from dataclasses import dataclass

from flowyard.errors import Forbidden
from flowyard.iam import permissions as perms


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: str
    username: str
    tenant_id: str | None
    permissions: frozenset[str]
    token_id: str
    # True when the token lists its permissions (narrowed); tokens it creates stay as narrow.
    narrowed: bool = False

    @property
    def is_admin(self) -> bool:
        return perms.ALL in self.permissions

    def can(self, permission: str) -> bool:
        return perms.implied(self.permissions, permission)

    def require(self, *permissions: str) -> None:
        for permission in permissions:
            if not self.can(permission):
                raise Forbidden(f"Missing permission {permission}.")

    def owns(self, owners: list[dict[str, str]]) -> bool:
        """Whether an owners list (of a flow or template) names this caller or its tenant."""
        keys = set(self.owner_keys())
        return any((o.get("type"), o.get("id")) in keys for o in owners)

    def owner_keys(self) -> list[tuple[str, str]]:
        """The (type, id) owner entries that make an object visible to this caller."""
        keys = [("user", self.user_id)]
        if self.tenant_id:
            keys.append(("tenant", self.tenant_id))
        return keys

"""The complete metadata: importing this registers every domain's tables."""

from __future__ import annotations

from flowyard.db.base import Base
from flowyard.executions import models as _executions  # noqa: F401
from flowyard.flows import models as _flows  # noqa: F401
from flowyard.iam import models as _iam  # noqa: F401
from flowyard.logs import models as _logs  # noqa: F401
from flowyard.secrets import models as _secrets  # noqa: F401
from flowyard.templates import models as _templates  # noqa: F401
from flowyard.webhooks import models as _webhooks  # noqa: F401

metadata = Base.metadata

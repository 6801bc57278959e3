"""What a long-running process of flowyard tells Python's garbage collector once started.

A full collection walks every container object the process holds: an API process holds
~150,000 once its modules, routes and schemas are loaded, and walking them takes 30 to 40 ms
on the project's machine, a pause every request in flight waits out (it showed as the one
slow call in forty of the list benchmarks, docs/performance.md). Those objects live as long
as the process, so once it has started they are moved out of the collector's sight
(``gc.freeze``): later collections walk only what was made since. Cycles made afterwards are
collected as before; what start-up made and later drops is freed by reference counting, as
nearly everything is.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect what start-up left behind, then keep everything alive now out of every later
    collection. Called once a process has started (``serve``, ``_api``, ``worker``, a runner)."""
    gc.collect()
    gc.freeze()

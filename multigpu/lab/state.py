"""The files in a lab's state folder (``/run/multigpu-lab/<id>``) that the lab and its keeper
share; neither imports the other."""

from __future__ import annotations

__all__ = ["KEEPER_FILE", "REQUESTS", "STATUS_FILE"]

#: What the keeper starts, and whose death takes the lab down (``{"groups": [...], "owner": ...}``).
KEEPER_FILE = "keeper.json"
#: How the keeper's starts went.
STATUS_FILE = "keeper-status.json"
#: A FIFO the keeper reads requests from: one JSON line {"id": N, "group": [item, ...]} each;
#: it answers in ``request-<N>.json`` with the same fields as the status file.
REQUESTS = "keeper.fifo"

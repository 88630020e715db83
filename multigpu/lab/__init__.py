"""The emulated lab: a cluster file brought up on one Linux machine as network namespaces
(one per host) joined by links shaped per pair of hosts, cgroups that give each host a
CPU share and a memory limit, and a Ray node per host with token authentication.

This layer is the only part of multigpu that runs ``ip``, ``tc`` or touches cgroups,
and it always takes down what it made. The profiler, the executor and ``launch`` run
over it unchanged: a lab host is just a host at an address (``multigpu lab exec HOST
-- CMD`` runs a command there).
"""

from __future__ import annotations

from multigpu.lab.lab import LAB_ROOT, PREFIX, Lab, down_all, labs, leftovers
from multigpu.lab.plan import HostPlan, LabPlan, LinkPlan, design

__all__ = ["LAB_ROOT", "PREFIX", "HostPlan", "Lab", "LabPlan", "LinkPlan", "design", "down_all", "labs", "leftovers"]

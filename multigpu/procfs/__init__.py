"""Linux's /proc read for the layers above: a process's stat fields (``stat``), which the
multi-process supervisor, the emulated lab and the profiler use to find a process's parent,
state, start time and CPU time (the standard library only)."""

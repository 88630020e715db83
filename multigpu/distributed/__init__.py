"""The multi-process side: the job description, the supervisor that starts and stops
ranks, the checked process group over each framework's engine, and joining a job
from inside a rank.

The job description (``multigpu.distributed.job``) is all an adapter's engine needs;
the supervisor (``multigpu.distributed.supervisor``) stands apart from it.
"""

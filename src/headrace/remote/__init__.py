"""headrace.remote: samples run by Ray actors on other nodes (``Options(remote=Remote(...))``).

Only ``remote/ray_backend.py`` imports ``ray``, and only once a loader with a ``Remote`` starts
its workers: without ``Options(remote=...)`` nothing of Ray is imported or started.
"""

from headrace.remote.config import Remote
from headrace.remote.offload_plan import plan_offload
from headrace.remote.storage import NearStorage

__all__ = ["NearStorage", "Remote", "plan_offload"]

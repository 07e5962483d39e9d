"""headrace.profiler."""

"""headrace.workloads."""

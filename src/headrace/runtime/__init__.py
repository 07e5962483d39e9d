"""headrace.runtime."""

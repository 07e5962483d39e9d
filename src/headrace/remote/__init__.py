"""headrace.remote."""

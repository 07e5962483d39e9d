"""headrace.bench."""

"""headrace.cache."""

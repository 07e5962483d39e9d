"""headrace.planner."""

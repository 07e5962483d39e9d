"""headrace.telemetry."""

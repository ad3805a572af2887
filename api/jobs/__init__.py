"""The service's job state and the event paths beside failures (speeds, plan updates)."""

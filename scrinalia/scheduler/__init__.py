"""The scheduler: schedules become SCHEDULE runs, and failed SCHEDULE runs are retried (ADR decision 8)."""

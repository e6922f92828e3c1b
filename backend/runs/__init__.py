"""tunedeck.backend.runs.manager."""

"""tunedeck.backend.machine."""

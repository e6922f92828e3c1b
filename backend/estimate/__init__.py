"""tunedeck.backend.estimate."""

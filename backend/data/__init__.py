"""tunedeck.backend.data."""

"""tunedeck.backend.after."""

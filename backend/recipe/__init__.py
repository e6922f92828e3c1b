"""tunedeck.backend.recipe."""

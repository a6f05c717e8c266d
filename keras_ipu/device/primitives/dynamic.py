"""dynamic primitives."""

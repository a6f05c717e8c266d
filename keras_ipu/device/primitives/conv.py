"""conv primitives."""

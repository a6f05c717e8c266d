"""sort primitives."""

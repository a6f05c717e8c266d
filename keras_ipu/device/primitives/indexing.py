"""indexing primitives."""

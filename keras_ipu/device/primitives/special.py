"""special primitives."""

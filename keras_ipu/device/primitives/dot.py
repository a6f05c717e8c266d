"""dot primitives."""

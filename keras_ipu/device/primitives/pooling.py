"""pooling primitives."""

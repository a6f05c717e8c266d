"""cumulative primitives."""

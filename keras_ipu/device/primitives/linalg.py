"""linalg primitives."""

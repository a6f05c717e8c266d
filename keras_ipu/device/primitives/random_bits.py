"""random_bits primitives."""

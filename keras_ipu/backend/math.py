"""Keras backend `math` ops for the ipu backend (built from device primitives)."""

"""Keras backend `linalg` ops for the ipu backend (built from device primitives)."""

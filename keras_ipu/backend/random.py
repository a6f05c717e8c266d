"""Keras backend `random` ops for the ipu backend (built from device primitives)."""

"""Keras backend `image` ops for the ipu backend (built from device primitives)."""

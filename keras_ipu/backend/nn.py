"""Keras backend `nn` ops for the ipu backend (built from device primitives)."""

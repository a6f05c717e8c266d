"""keras.ops.image for the ipu backend, by kind of op (see ../image.py)."""

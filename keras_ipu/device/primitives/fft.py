"""fft primitives."""

"""The nn ops of the ipu backend, by kind; nn.py re-exports them."""

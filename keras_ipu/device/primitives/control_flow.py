"""control_flow primitives."""

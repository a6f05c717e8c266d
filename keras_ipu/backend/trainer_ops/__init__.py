"""The pieces of the ipu Trainer: the model's state as explicit values
(model_state), the device loop that runs one execution's steps as one
compiled program (device_loop), and the optimizer base class whose
step-dependent branches compile (optimizer)."""

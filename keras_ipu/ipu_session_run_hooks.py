"""keras_ipu.ipu_session_run_hooks: Graphcore's
`tensorflow.python.ipu.ipu_session_run_hooks` (the implementation is
keras_ipu/estimators/hooks.py)."""

from keras_ipu.estimators.hooks import IPULoggingTensorHook

__all__ = ["IPULoggingTensorHook"]

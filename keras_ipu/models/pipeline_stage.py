"""`PipelineStage(n)`: the context in which Keras layers (constructed, or
called) are assigned to pipeline stage n, as Graphcore's
`keras.ipu.PipelineStage`.

    with strategy.scope():
        x = keras.Input((4,))
        with ipu.keras.PipelineStage(0):
            x = keras.layers.Dense(8)(x)
        with ipu.keras.PipelineStage(1):
            y = keras.layers.Dense(2)(x)
        model = keras.Model(inputs, y)   # pipelined over two stages

The layers record it (keras_ipu/backend/layer.py); the model reads it when
it is first asked for its pipeline stage assignment.
"""

from keras_ipu.distribute import scope as _scope


class PipelineStage:
    def __init__(self, stage):
        self._stage = stage

    def __enter__(self):
        if not isinstance(self._stage, int) or self._stage < 0:
            raise ValueError(f"{self._stage} is not a valid pipeline stage.")
        if _scope.current_strategy() is None:
            raise RuntimeError(
                "PipelineStage may only be used from within an IPUStrategy context."
            )
        if _scope.current_pipeline_stage() is not None:
            raise RuntimeError("Pipeline stages must not be nested.")
        _scope.set_pipeline_stage(self._stage)
        return self

    def __exit__(self, exception_type, value, traceback):
        _scope.set_pipeline_stage(None)

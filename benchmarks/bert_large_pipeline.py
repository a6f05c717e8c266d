"""BERT-Large phase 1 (sequence 128) pipelined over four IPUs, as Graphcore
published it: does it fit, and how fast would it train on a Bow Pod16?

    KERAS_BACKEND=ipu python benchmarks/bert_large_pipeline.py [--ipus 4]

The model (24 encoder layers, hidden 1024, 16 heads, feed-forward 4096,
vocabulary 30400, 20 masked positions per sequence, next-sentence head) is
a Keras Functional model built with `ipu.keras.PipelineStage`, in the
pipeline of Graphcore's configuration (graphcore/examples,
nlp/bert/tensorflow2/configs/pretrain_large_128_phase1.json): stages
[embedding + 3 layers], [7 layers] x 3, [masked-LM and NSP heads] on IPUs
[0, 1, 2, 3, 0] (the heads share the embedding's weights, so they sit on
IPU 0 with it), micro-batch 8, 2040 micro-batches per weight update, 4
replicas (16 IPUs), LAMB with float32 moments (their optimizer's m_dtype /
v_dtype) kept in Streaming Memory (`optimizer_state_offchip`: true, so
offload_weight_update_variables=True; replicated_tensor_sharding false),
float16 weights and activations, RUNNING_MEAN accumulation, schedule
Grouped, recomputation_mode RecomputeAndBackpropagateInterleaved (all as
run_pretraining.py passes them to set_pipelining_options), a recomputation
checkpoint after each encoder layer (as convert_bert_model.py adds).

Trace and compile only: the model is built in
`keras.StatelessScope(initialize_variables=False)`, so its 340M weights
and the optimizer's slots are never allocated; one micro-batch's training
step is traced and its program placed on the IPUs by the simulator
(keras_ipu/models/prediction.py). Also asked: on fewer IPUs (the same
layers split evenly, each stage on its own IPU) it must not fit.

Published figure: Graphcore's performance results for the Bow Pod16,
BERT-Large phase 1 pre-training (sequence length 128), about 5,200
sequences/s (https://www.graphcore.ai/performance-results, as quoted in
shared/DESIGN.md's anchors).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "ipu")

PUBLISHED_POD16_SEQUENCES_PER_S = 5200
SEQUENCE, HIDDEN, LAYERS, HEADS, FEED_FORWARD = 128, 1024, 24, 16, 4096
VOCABULARY, MASKED, MICRO_BATCH = 30400, 20, 8
ACCUMULATION, REPLICAS = 2040, 4
# Layers of each stage (the embedding is in the first, the heads in the last).
GRAPHCORE_STAGES = [3, 7, 7, 7]
GRAPHCORE_DEVICE_MAPPING = [0, 1, 2, 3, 0]


def encoder_layer(x, name):
    import keras

    import keras_ipu as ipu

    attention = keras.layers.MultiHeadAttention(
        HEADS, HIDDEN // HEADS, dropout=0.0, name=f"{name}_attention")(x, x)
    attention = keras.layers.Dropout(0.1)(attention)
    x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"{name}_ln1")(
        keras.layers.Add()([x, attention]))
    h = keras.layers.Dense(FEED_FORWARD, activation="gelu", name=f"{name}_ff1")(x)
    h = keras.layers.Dense(HIDDEN, name=f"{name}_ff2")(h)
    h = keras.layers.Dropout(0.1)(h)
    x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"{name}_ln2")(
        keras.layers.Add()([x, h]))
    # Graphcore's conversion puts a recomputation checkpoint after every
    # encoder layer (convert_bert_model.py, ModelAddRecomputationCheckpoints
    # after TFBertLayer): the backward pass recomputes one layer at a time.
    return ipu.layers.RecomputationCheckpoint(name=f"{name}_checkpoint")(x)


def _position_embedding():
    import keras

    class PositionEmbedding(keras.layers.Layer):
        """Adds a learnt embedding of each position (BERT's absolute
        positions, the first SEQUENCE of 512)."""

        def build(self, input_shape):
            self.embeddings = self.add_weight(shape=(512, HIDDEN), name="embeddings")

        def call(self, x):
            return x + keras.ops.cast(self.embeddings[:SEQUENCE], x.dtype)

    return PositionEmbedding


def _tied_decoder():
    import keras

    class TiedDecoder(keras.layers.Layer):
        """Logits of the masked positions against the word embedding's
        weights (BERT ties them)."""

        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def build(self, input_shape):
            self.bias = self.add_weight(shape=(VOCABULARY,), initializer="zeros", name="bias")

        def call(self, x):
            table = keras.ops.cast(self.embedding.embeddings, x.dtype)
            return keras.ops.matmul(x, keras.ops.transpose(table)) + self.bias

    return TiedDecoder


def bert_large(stage_layers=GRAPHCORE_STAGES):
    """The Functional BERT-Large pre-training model, its layers in the
    PipelineStage of `stage_layers` (layers per stage; one more stage holds
    the heads)."""
    import keras

    import keras_ipu as ipu

    ids = keras.Input((SEQUENCE,), dtype="int32", name="input_ids")
    types = keras.Input((SEQUENCE,), dtype="int32", name="token_type_ids")
    positions = keras.Input((MASKED,), dtype="int32", name="masked_positions")
    boundaries = [sum(stage_layers[:k + 1]) for k in range(len(stage_layers))]
    with ipu.keras.PipelineStage(0):
        word = keras.layers.Embedding(VOCABULARY, HIDDEN, name="word_embeddings")
        token_type = keras.layers.Embedding(2, HIDDEN, name="token_type_embeddings")
        x = keras.layers.Add()([word(ids), token_type(types)])
        x = _position_embedding()(name="position_embeddings")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_ln")(x)
        x = keras.layers.Dropout(0.1)(x)
    for layer in range(LAYERS):
        stage = next(k for k, b in enumerate(boundaries) if layer < b)
        with ipu.keras.PipelineStage(stage):
            x = encoder_layer(x, f"encoder_{layer}")
    with ipu.keras.PipelineStage(len(stage_layers)):
        masked = keras.ops.take_along_axis(x, keras.ops.expand_dims(positions, -1), axis=1)
        h = keras.layers.Dense(HIDDEN, activation="gelu", name="mlm_transform")(masked)
        h = keras.layers.LayerNormalization(epsilon=1e-12, name="mlm_ln")(h)
        mlm = _tied_decoder()(word, name="mlm_logits")(h)
        pooled = keras.layers.Dense(HIDDEN, activation="tanh", name="pooler")(x[:, 0])
        nsp = keras.layers.Dense(2, name="nsp_logits")(pooled)
    return keras.Model([ids, types, positions], [mlm, nsp], name="bert_large")


def _lamb_float32_moments():
    import keras

    class Lamb(keras.optimizers.Lamb):
        """Keras' LAMB with its moments in float32 whatever the weights'
        dtype, as Graphcore's BERT optimizer keeps them (m_dtype=v_dtype=
        tf.float32 in keras_extensions/optimization.py)."""

        def build(self, var_list):
            if self.built:
                return
            keras.optimizers.Optimizer.build(self, var_list)
            self._momentums, self._velocities = [], []
            for var in var_list:
                for slots, name in ((self._momentums, "momentum"),
                                    (self._velocities, "velocity")):
                    slots.append(self.add_variable(
                        shape=var.shape, dtype="float32", initializer="zeros",
                        name=f"{var.path.replace('/', '_')}_{name}"))

    return Lamb


def configure():
    """A Bow Pod16 (4 replicas of the 4-IPU pipeline) with recomputation
    allowed, as Graphcore's configuration runs it (the pipeline's
    recomputation_mode applies only with IPUConfig.allow_recompute)."""
    import keras_ipu as ipu

    config = ipu.config.IPUConfig()
    config.ipu_model.version = "ipu21"
    config.auto_select_ipus = 4 * REPLICAS
    config.allow_recompute = True
    config.configure_ipu_system()


def predict(stage_layers=GRAPHCORE_STAGES, device_mapping=GRAPHCORE_DEVICE_MAPPING,
            target="ipu21"):
    """Build (without allocating), compile and predict one configuration."""
    import keras

    import keras_ipu as ipu
    from keras_ipu.ops.pipelining_ops import PipelineSchedule
    from keras_ipu.ops.pipelining_ops import RecomputationMode

    configure()
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float16")
    strategy = ipu.ipu_strategy.IPUStrategy()
    try:
        # Its step counter is a plain variable (the slots come later, lazily).
        optimizer = _lamb_float32_moments()(learning_rate=0.006, weight_decay=0.01)
        with keras.StatelessScope(initialize_variables=False), strategy.scope():
            model = bert_large(stage_layers)
            model.compile(
                optimizer=optimizer,
                loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True)] * 2,
            )
            model.optimizer.build(model.trainable_variables)
            model.set_pipelining_options(
                gradient_accumulation_steps_per_replica=ACCUMULATION,
                device_mapping=list(device_mapping),
                gradient_accumulation_reduction_method=(
                    ipu.optimizers.GradientAccumulationReductionMethod.RUNNING_MEAN),
                pipeline_schedule=PipelineSchedule.Grouped,
                recomputation_mode=RecomputationMode.RecomputeAndBackpropagateInterleaved,
                offload_weight_update_variables=True,
                replicated_optimizer_state_sharding=False,
            )
            t0 = time.perf_counter()
            prediction = ipu.models.predict_training(
                model, MICRO_BATCH, replicas=REPLICAS, target=target)
            seconds = time.perf_counter() - t0
    finally:
        keras.config.set_dtype_policy(previous)
    return prediction, seconds


def even_split(ipus):
    """Layers per stage over `ipus` IPUs (the heads with the embedding)."""
    base, extra = divmod(LAYERS, ipus)
    return [base + (1 if k < extra else 0) for k in range(ipus)], list(range(ipus)) + [0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ipus", type=int, nargs="*", default=[4, 2])
    args = parser.parse_args(argv)
    for ipus in args.ipus:
        if ipus == 4:
            stages, mapping = GRAPHCORE_STAGES, GRAPHCORE_DEVICE_MAPPING
        else:
            stages, mapping = even_split(ipus)
        prediction, seconds = predict(stages, mapping)
        print(prediction)
        print(f"  (traced and compiled in {seconds:.0f} s)")
        if ipus == 4:
            sps = prediction.samples_per_second
            print(f"  predicted Bow Pod16 ({REPLICAS} replicas x 4 IPUs): {sps:,.0f} sequences/s; "
                  f"published {PUBLISHED_POD16_SEQUENCES_PER_S:,}; ratio "
                  f"{sps / PUBLISHED_POD16_SEQUENCES_PER_S:.2f}")
        print(f"  on {ipus} IPUs: {'fits' if prediction.fits else 'does not fit'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

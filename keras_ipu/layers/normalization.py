"""Group, instance and layer normalization as Graphcore's IPU layers: one
group-norm computation (as PopLibs' popnn::gn serves all three), trainable
gamma and beta, statistics of the batch itself (no moving statistics)."""

import functools
import operator

import keras
from keras import ops

from keras_ipu.layers._base import check_unsupported
from keras_ipu.layers._base import serializable


def _reshape(x, shape):
    """Reshape to `shape`, whose one unknown (batch) dim is inferred."""
    return ops.reshape(x, tuple(-1 if d is None else d for d in shape))


def group_norm(x, gamma, beta, groups, channels_axis, epsilon,
               strided_channel_grouping):
    """Group normalization of x over its non-batch dims and the channels of
    each group; per-channel gamma and beta. With strided grouping (PopLibs'
    efficient layout) channel c is in group c % groups, otherwise in group
    c // (channels / groups), as everyone else groups channels."""
    rank = len(x.shape)
    if channels_axis != rank - 1:
        x = ops.moveaxis(x, channels_axis, -1)
    shape = tuple(x.shape)
    channels = shape[-1]
    per_group = channels // groups
    if strided_channel_grouping:
        grouped = _reshape(x, shape[:-1] + (per_group, groups))
        group_axis = -1
    else:
        grouped = _reshape(x, shape[:-1] + (groups, per_group))
        group_axis = -2
    reduce = tuple(a for a in range(1, len(grouped.shape))
                   if a != len(grouped.shape) + group_axis)
    dtype = grouped.dtype
    compute = "float32" if dtype in ("float16", "bfloat16") else dtype
    grouped = ops.cast(grouped, compute)
    mean, variance = ops.moments(grouped, axes=reduce, keepdims=True)
    normalized = (grouped - mean) * ops.rsqrt(variance + epsilon)
    out = _reshape(normalized, shape)
    out = out * ops.cast(gamma, compute) + ops.cast(beta, compute)
    out = ops.cast(out, dtype)
    if channels_axis != rank - 1:
        out = ops.moveaxis(out, -1, channels_axis)
    return out


@serializable
class GroupNormalization(keras.layers.Layer):
    """Group normalization layer optimized for running on the IPU.

    Used like Keras' BatchNormalization, with trainable beta and gamma and
    no statistics gathering (https://arxiv.org/abs/1803.08494).

    Args:
      groups: number of groups of channels.
      channels_axis: the channels axis: 1 (NCHW) or the last (NHWC).
      center, scale: add beta / multiply by gamma.
      epsilon: added to the variance.
      beta_initializer, gamma_initializer: initializers of beta and gamma
        (None: Keras' default for a float weight, as Graphcore's layer).
      strided_channel_grouping: group channel c with the channels c + k *
        groups (PopLibs' efficient, unconventional grouping); False groups
        neighbouring channels, as keras.layers.GroupNormalization.
    """

    def __init__(self, groups=2, channels_axis=-1, center=True, scale=True,
                 epsilon=1e-3, beta_initializer=None, gamma_initializer=None,
                 strided_channel_grouping=True, trainable=True, **kwargs):
        super().__init__(trainable=trainable, **kwargs)
        self.groups = groups
        self.channels_axis = channels_axis
        self.center = center
        self.scale = scale
        self.epsilon = epsilon
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.strided_channel_grouping = strided_channel_grouping
        self.channels = None

    def build(self, input_shape):
        self._build_parameters(input_shape)

    def _build_parameters(self, input_shape, parameter_shape=None):
        if input_shape is None:
            raise ValueError("Input has undefined rank.")
        rank = len(input_shape)
        if self.channels_axis > rank - 1:
            raise ValueError("Axis is out of bounds.")
        if self.channels_axis < 0:
            self.channels_axis = rank + self.channels_axis
        self.channels = input_shape[self.channels_axis]
        if self.groups > self.channels:
            raise ValueError(
                f"Invalid groups {self.groups} for {self.channels} channels.")
        if self.channels % self.groups != 0:
            raise ValueError(
                f"{self.channels} channels is not commensurate with "
                f"{self.groups} groups.")
        if self.channels_axis not in (1, rank - 1):
            raise ValueError(
                "Unsupported data format, group norm only supports NCHW"
                "(channel axis 1) and NHWC (channel axis -1).")
        shape = tuple(parameter_shape or (self.channels,))
        self.gamma = self.beta = None
        if self.scale:
            self.gamma = self.add_weight(
                shape=shape, initializer=self.gamma_initializer, name="gamma",
                trainable=self.trainable)
        if self.center:
            self.beta = self.add_weight(
                shape=shape, initializer=self.beta_initializer, name="beta",
                trainable=self.trainable)

    def _parameters(self, dtype):
        gamma = (ops.reshape(self.gamma, (-1,)) if self.gamma is not None
                 else ops.ones((self.channels,), dtype))
        beta = (ops.reshape(self.beta, (-1,)) if self.beta is not None
                else ops.zeros((self.channels,), dtype))
        return gamma, beta

    def call(self, inputs, training=None):
        # Training and inference both normalize with the batch's statistics.
        gamma, beta = self._parameters(self.compute_dtype)
        return group_norm(inputs, gamma, beta, self.groups, self.channels_axis,
                          self.epsilon, self.strided_channel_grouping)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "groups": self.groups,
            "channels_axis": self.channels_axis,
            "center": self.center,
            "scale": self.scale,
            "epsilon": self.epsilon,
            "beta_initializer": keras.initializers.serialize(self.beta_initializer),
            "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
            "strided_channel_grouping": self.strided_channel_grouping,
        }


@serializable
class InstanceNormalization(GroupNormalization):
    """Instance normalization layer optimized for use on the IPU: group
    normalization with one group per channel
    (https://arxiv.org/abs/1607.08022). Arguments as GroupNormalization's,
    without groups."""

    def __init__(self, channels_axis=-1, center=True, scale=True, epsilon=1e-3,
                 beta_initializer=None, gamma_initializer=None, trainable=True,
                 **kwargs):
        super().__init__(groups=0, channels_axis=channels_axis, center=center,
                         scale=scale, epsilon=epsilon,
                         beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer,
                         trainable=trainable, **kwargs)

    def build(self, input_shape):
        self.groups = input_shape[self.channels_axis]
        super().build(input_shape)

    def get_config(self):
        config = super().get_config()
        del config["groups"], config["strided_channel_grouping"]
        return config


@serializable
class LayerNormalization(GroupNormalization):
    """Layer normalization layer optimized for use on the IPU
    (https://arxiv.org/abs/1607.06450): each sample normalized over `axis`
    (an int or a list of ints), with gamma and beta of those dims' shape.

    `beta_regularizer`, `gamma_regularizer`, `beta_constraint` and
    `gamma_constraint` are refused with NotImplementedError, as Graphcore's
    layer refuses them.
    """

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True,
                 beta_initializer="zeros", gamma_initializer="ones",
                 beta_regularizer=None, gamma_regularizer=None,
                 beta_constraint=None, gamma_constraint=None, trainable=True,
                 **kwargs):
        if isinstance(axis, (list, tuple)):
            axis = list(axis)
        elif not isinstance(axis, int):
            raise ValueError(
                "Expected an int or a list/tuple of ints for the argument "
                f"'axis', but received instead: {axis}")
        super().__init__(groups=1, channels_axis=-1, center=center, scale=scale,
                         epsilon=epsilon, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer,
                         trainable=trainable, **kwargs)
        self.axis = axis
        check_unsupported(self, beta_regularizer, "beta_regularizer")
        check_unsupported(self, gamma_regularizer, "gamma_regularizer")
        check_unsupported(self, beta_constraint, "beta_constraint")
        check_unsupported(self, gamma_constraint, "gamma_constraint")

    def build(self, input_shape):
        rank = len(input_shape)
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        axes = [a + rank if a < 0 else a for a in axes]
        parameter_shape = [input_shape[a] if 0 <= a < rank else None for a in axes]
        for a in axes:
            if a < 0 or a >= rank:
                raise ValueError(f"Invalid axis: {a}")
        if len(axes) != len(set(axes)):
            raise ValueError(f"Duplicate axis: {tuple(axes)}")
        if any(input_shape[a] is None for a in axes):
            raise ValueError(
                f"Input shape {tuple(input_shape)} has unknown dimensions - all "
                "dimensions need to be fully specified.")
        self.axis = sorted(axes)
        self._reduced = functools.reduce(
            operator.mul, [input_shape[a] for a in self.axis], 1)
        self._build_parameters((None, self._reduced), parameter_shape)

    def call(self, inputs, training=None):
        # As Graphcore's: the reduced dims are moved last and flattened, and
        # the result is one group normalization with a single group.
        rank = len(inputs.shape)
        kept = [a for a in range(rank) if a not in self.axis]
        permutation = kept + self.axis
        moved = ops.transpose(inputs, permutation)
        flat = ops.reshape(moved, (-1, self._reduced))
        gamma, beta = self._parameters(self.compute_dtype)
        out = group_norm(flat, gamma, beta, 1, 1, self.epsilon, True)
        out = _reshape(out, tuple(moved.shape))
        inverse = [permutation.index(a) for a in range(rank)]
        return ops.transpose(out, inverse)

    def get_config(self):
        config = super().get_config()
        for key in ("groups", "channels_axis", "strided_channel_grouping"):
            del config[key]
        config["axis"] = self.axis
        return config


GroupNorm = GroupNormalization
InstanceNorm = InstanceNormalization
LayerNorm = LayerNormalization

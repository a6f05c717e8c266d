"""The placement of a pipelined program: one record for every path that
compiles one (a Keras model's fit on the ipu backend, a tf.keras model's
fit through the TensorFlow front end, a functional pipelining_ops.pipeline).

    placed = PipelinePlacement.of(device_mapping=(0, 1), schedule="Grouped",
                                  gradient_accumulation_count=4)
    graph = placed.staged(graph)             # imported programs: stages by op name
    exe = compile_graph(graph, placed.options(CompileOptions()))
    exe.prediction                           # follows the schedule

It holds what the placed program needs besides its nodes: the IPU of each
stage (compiler/placement.py places the nodes), the recomputation mode the
schedule resolves, the rule giving an imported node its stage from its
TensorFlow op name (frontends/tensorflow/stages.py; None where the trace
recorded the stages), and the schedule and micro-batches per step
(simulator/sharding.Pipelining, with the optimizer state it offloads),
which the executable's prediction applies (CompileOptions.pipeline: its
cycles, memory per IPU, samples/s, the profile and the cycle log are the
schedule's).
"""

import dataclasses

from keras_ipu.device.compiler.options import CONFIGURED
from keras_ipu.device.compiler.placement import Placement
from keras_ipu.device.simulator.sharding import Pipelining


@dataclasses.dataclass(frozen=True)
class PipelinePlacement:
    device_mapping: tuple  # IPU of stage s (None: IPU s)
    pipelining: object = None  # sharding.Pipelining; None: sharded, not pipelined
    recomputation: object = CONFIGURED  # the compile option (compiler/recompute.py)
    stage_of: object = None  # op name -> stage (imported programs), or None

    @classmethod
    def of(cls, device_mapping, schedule=None, gradient_accumulation_count=None,
           training=True, recomputation=CONFIGURED, stage_of=None, once_per_step=(),
           loop_micro_batches=None, offload=None, batch_serialization_iterations=1):
        """The record of a program pipelined under `schedule` (a
        PipelineSchedule or its name; None: placed but not pipelined)."""
        pipelining = None
        if schedule is not None:
            pipelining = Pipelining(
                getattr(schedule, "name", schedule), gradient_accumulation_count,
                training, tuple(once_per_step), loop_micro_batches, offload=offload,
                batch_serialization_iterations=batch_serialization_iterations)
        mapping = None if device_mapping is None else tuple(device_mapping)
        return cls(mapping, pipelining, recomputation, stage_of)

    def staged(self, graph):
        """`graph` (imported, not yet placed) with its nodes' stages from
        their op names; as it is when the trace recorded them."""
        if self.stage_of is None:
            return graph
        from keras_ipu.frontends.tensorflow.stages import staged_by_name

        return staged_by_name(graph, self.stage_of)

    def options(self, base):
        """`base` (CompileOptions) placing the program on its IPUs, with its
        recomputation mode and its schedule (which its prediction applies)."""
        changes = {"placement": Placement.of({}, self.device_mapping),
                   "pipeline": self.pipelining}
        if self.recomputation != CONFIGURED:
            changes["recomputation"] = self.recomputation
        return dataclasses.replace(base, **changes)

"""The compiler: passes over the traced Graph, lowering to an Executable,
and the executable cache. One pass per module:

- static_shapes.check_static_shapes   IPU programs have static shapes
- demotion.demote_64bit               float64/int64 -> float32/int32
- constant_folding.fold_constants     Literal-only nodes evaluated now
- common_subexpressions.eliminate_common_subexpressions
- dead_code.eliminate_dead_code
- placement.place                     pipeline stage and IPU of every node,
                                      inter-IPU copies (CompileOptions.placement)
- fusion.fuse_elementwise             elementwise chains -> one kernel
- lowering, dot_lowering, array_lowering, control_flow
                                      kernels specialised at lowering time;
                                      cond/while/scan bodies compiled first
- executable.Executable               the lowered program and its run loop
- device_checks                       memory and cycles of the program on
                                      the configured IPU; out-of-memory
                                      error; profile report; cycle log
- progress                            the compile progress bar
- pipeline.compile_graph              all of the above, in order
  (liveness, for freeing buffers, is ../liveness.py: the simulator uses it too)
- cache.CACHE                         in memory and on disk
"""

from keras_ipu.device.compiler.cache import CACHE
from keras_ipu.device.compiler.cache import CacheWarning
from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.compiler.demotion import DemotionWarning
from keras_ipu.device.compiler.executable import DeviceNotAttachedError
from keras_ipu.device.compiler.executable import Executable
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.pipeline import compile_graph
from keras_ipu.device.compiler.pipeline import optimize
from keras_ipu.device.compiler.static_shapes import StaticShapeError

__all__ = [
    "CACHE",
    "CacheWarning",
    "CompileOptions",
    "DemotionWarning",
    "DeviceNotAttachedError",
    "Executable",
    "ExecutableCache",
    "StaticShapeError",
    "compile_graph",
    "optimize",
]

"""Distribution on IPUs: IPUStrategy (strategy.py), the strategy in scope
(scope.py), running a function on every replica (run.py), cross-replica
reductions (cross_replica.py), per-replica values (values.py).

The replicas themselves run in the simulator (device/simulator/replicas.py)
and meet in the collective primitives (device/primitives/collective.py).
"""

from keras_ipu.distribute.cross_replica import cross_replica_mean  # noqa: F401
from keras_ipu.distribute.cross_replica import cross_replica_sum  # noqa: F401
from keras_ipu.distribute.scope import current_strategy as get_strategy  # noqa: F401
from keras_ipu.distribute.strategy import IPUStrategy  # noqa: F401
from keras_ipu.distribute.strategy import IPUStrategyV1  # noqa: F401
from keras_ipu.distribute.strategy import ReduceOp  # noqa: F401
from keras_ipu.distribute.values import PerReplica  # noqa: F401

"""The executable file of application_compile_op and embedded_runtime.

Graphcore's file holds a Poplar executable and a protobuf signature
(the inputs given at start, the streamed inputs and outputs of each call).
Ours holds the same signature and our compiled program (an Executable,
which pickles as the on-disk executable cache stores it), with what a
runtime needs to feed it without the TensorFlow function it came from:
per program parameter a start input or a frozen value, the variable
updates each run makes, and the ids the program's infeeds and outfeeds
were compiled with (the runtime serves those ids itself). The file is
written whole or not at all (temporary file + rename).
"""

import dataclasses
import pickle

from keras_ipu import _atomic_files

MAGIC = b"keras_ipu application executable 2\n"
SUFFIX = ".ipu_app"


@dataclasses.dataclass(frozen=True)
class TensorSignature:
    name: str
    shape: tuple
    dtype: object  # a NumPy dtype


@dataclasses.dataclass(frozen=True)
class Stream:
    """An infeed or outfeed of the program: its id there and its components."""

    stream_id: int
    components: tuple  # of TensorSignature


@dataclasses.dataclass
class Application:
    executable: object
    replication_factor: int  # the compiled program's replicas
    inputs: tuple  # TensorSignature of each start input
    feed: tuple  # per program parameter: ("input", k) or ("value", array); then "token"
    uses_token: bool
    updates: tuple  # (program output, program parameter) a run writes back
    infeeds: tuple  # of Stream
    outfeeds: tuple  # of Stream

    @property
    def streamed_inputs(self):
        return tuple(c for s in self.infeeds for c in s.components)

    @property
    def streamed_outputs(self):
        return tuple(c for s in self.outfeeds for c in s.components)


def write(path, application):
    data = pickle.dumps(application, protocol=pickle.HIGHEST_PROTOCOL)
    _atomic_files.write_bytes(path, (MAGIC, data), mode=_atomic_files.default_mode())


def read(path):
    """The Application in the file at `path`."""
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
        if magic != MAGIC:
            # Graphcore's message, naming our format.
            raise ValueError(
                f"Executable file '{path}' is not a keras_ipu application "
                "executable (write one with "
                "application_compile_op.experimental_application_compile_op).")
        return pickle.loads(f.read())

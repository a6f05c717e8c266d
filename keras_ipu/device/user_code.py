"""Where a warning should point: the user's line, not ours.

A warning raised deep inside a compile (a demotion, a recompile, a bad
cache entry) is about the user's call that led there: `fit`, `predict`, a
jitted function. Python shows the file and line of the frame
`stacklevel` names, so that frame must be the first one outside keras_ipu
and Keras.
"""

import os
import sys

_OURS = []


def _our_directories():
    if len(_OURS) < 2:  # keras_ipu's, then Keras' once it is imported
        _OURS[:] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
        keras = sys.modules.get("keras")
        if keras is not None and getattr(keras, "__file__", None):
            _OURS.append(os.path.dirname(os.path.abspath(keras.__file__)) + os.sep)
    return tuple(_OURS)


def stacklevel():
    """The `stacklevel` for a warnings.warn made by the caller of this
    function that points at the first frame outside keras_ipu and Keras."""
    ours = _our_directories()
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        frame, level = frame.f_back, level + 1
    return level

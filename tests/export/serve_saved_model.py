"""Serve a SavedModel in a fresh TensorFlow process (run by path, not
imported): `python serve_saved_model.py PATH INPUTS.npz ENDPOINT` calls the
endpoint (an attribute of the loaded object; or "signature:NAME" for a
signature of one input, "signature:NAME:IN1,IN2" naming its inputs in
order) on the arrays of INPUTS.npz (arr_0, arr_1, ... in order) and
prints JSON: the outputs (a dict of lists, or a list) and the modules of
keras_ipu's machinery (backend, device, export, front end, models, ops)
the process loaded."""

import json
import sys

import numpy as np
import tensorflow as tf

path, inputs_file, endpoint = sys.argv[1:4]
loaded = tf.saved_model.load(path)
with np.load(inputs_file) as npz:
    arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]
if endpoint.startswith("signature:"):
    _, name, *names = endpoint.split(":")
    tensors = [tf.constant(a) for a in arrays]
    if names:
        out = loaded.signatures[name](**dict(zip(names[0].split(","), tensors)))
    else:
        out = loaded.signatures[name](*tensors)
else:
    out = getattr(loaded, endpoint)(*arrays)
if isinstance(out, dict):
    out = {k: v.numpy().tolist() for k, v in out.items()}
else:
    out = out.numpy().tolist()
# The .pth start-up hook imports keras_ipu's package (its __init__ and
# what that needs); serving must need nothing of its machinery.
modules = sorted(m for m in sys.modules if m.split(".")[:2] in (
    ["keras_ipu", "backend"], ["keras_ipu", "device"], ["keras_ipu", "export"],
    ["keras_ipu", "frontends"], ["keras_ipu", "models"], ["keras_ipu", "ops"]))
print(json.dumps({"out": out, "modules": modules}))

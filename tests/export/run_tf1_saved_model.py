"""Run MetaGraphs of a TensorFlow 1 SavedModel in a fresh TensorFlow
process, as a TF1 user ran an estimator's TRAIN or EVAL export (run by
path, not imported): `python run_tf1_saved_model.py JOBS.json`; each job
{"path", "tag", "signature", "inputs" (an .npz of arrays saved by input
name), "runs", optional "loader": "tf2"} loads the MetaGraph tagged
`tag` into a new tf.compat.v1.Session (restoring its variables, running
its init op) and `runs` times runs the signature on the inputs together
with the graph's train op, if it has one; with "loader": "tf2", loads it
with tf.saved_model.load and calls the signature `runs` times. Prints JSON: per job, the outputs of each run,
the global variables' values after the runs and whether there was a
train op; and the modules of keras_ipu's machinery the process loaded."""

import json
import sys

import numpy as np
import tensorflow as tf

jobs_file = sys.argv[1]
with open(jobs_file) as f:
    jobs = json.load(f)
results = []
for job in jobs:
    if job.get("loader") == "tf2":
        # TensorFlow 2's loader: the signature as a function, no train op.
        loaded = tf.saved_model.load(job["path"], tags=[job["tag"]])
        function = loaded.signatures[job["signature"]]
        with np.load(job["inputs"]) as npz:
            inputs = {name: tf.constant(npz[name]) for name in npz.files}
        runs = [function(**inputs) for _ in range(job["runs"])]
        variables = {v.name.split(":")[0]: v.numpy().tolist() for v in loaded.variables}
        results.append({"runs": [{k: v.numpy().tolist() for k, v in out.items()} for out in runs],
                        "variables": variables, "train_op": False})
        continue
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, [job["tag"]], job["path"])
        definition = meta.signature_def[job["signature"]]
        with np.load(job["inputs"]) as npz:
            feed = {graph.get_tensor_by_name(definition.inputs[name].name): npz[name]
                    for name in npz.files}
        fetches = {key: graph.get_tensor_by_name(info.name)
                   for key, info in definition.outputs.items()}
        train_ops = graph.get_collection("saved_model_train_op")
        runs = [session.run((fetches, train_ops), feed)[0] for _ in range(job["runs"])]
        variables = {v.op.name: session.run(v).tolist()
                     for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    results.append({"runs": [{k: np.asarray(v).tolist() for k, v in out.items()} for out in runs],
                    "variables": variables, "train_op": bool(train_ops)})
modules = sorted(m for m in sys.modules if m.split(".")[:2] in (
    ["keras_ipu", "backend"], ["keras_ipu", "device"], ["keras_ipu", "export"],
    ["keras_ipu", "frontends"], ["keras_ipu", "models"], ["keras_ipu", "ops"]))
print(json.dumps({"results": results, "modules": modules}))

"""Graphcore's estimators (ipu_estimator, ipu_run_config,
ipu_session_run_hooks) on the TensorFlow front end: tf.estimator's contract
(model_fn(features, labels, mode, params); train / evaluate / predict;
checkpoints in model_dir) with the steps compiled through the bridge and
run on the simulated IPU. TensorFlow is imported when they are used."""

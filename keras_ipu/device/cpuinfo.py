"""Linux's /proc/cpuinfo, read once for the engine's prediction (the
CPU's flags: engine_prediction.py) and for the benchmark's report (its
model: benchmarks/fit_throughput.py). Standard library only: the
benchmark's driver imports it and never imports keras, NumPy or the
engine."""


def first_cpu(cpuinfo="/proc/cpuinfo"):
    """The first processor's fields (name -> value, both stripped
    strings); empty where there is no such file. Every processor of a
    host has the same model and flags in practice, so the first speaks
    for all."""
    fields = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields

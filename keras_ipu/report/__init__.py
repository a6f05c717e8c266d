"""Reading keras_ipu profile reports: `python -m keras_ipu.report DIR`.

The reports are the JSON files keras_ipu.device.simulator.profile writes
per compiled executable (its docstring holds the schema). This package
prints a summary table and draws the pictures (memory per tile, liveness
over program steps, the predicted execution timeline) as PNG files and one
self-contained HTML page.
"""

from keras_ipu.report.loading import find_reports  # noqa: F401
from keras_ipu.report.loading import load_report  # noqa: F401

"""Finding and reading report files."""

import glob
import json
import os

from keras_ipu.device.simulator import profile

HOW_TO = (
    "Profile reports are written when profiling is on, one per compiled "
    "program. Run your script with\n"
    f"  {profile.EXAMPLE}\n"
    "(or set IPUConfig.compilation_poplar_options to those options), then run\n"
    "  python -m keras_ipu.report ./reports"
)


class ReportError(ValueError):
    pass


def load_report(path):
    """The report dict in `path`; ReportError when it is not one this
    keras_ipu can read."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(report, dict) or report.get("kind") != profile.KIND:
        raise ReportError(f"{path}: not a keras_ipu profile report")
    version = report.get("format_version")
    if version != profile.FORMAT_VERSION:
        raise ReportError(
            f"{path}: report format {version}, but this keras_ipu reads format "
            f"{profile.FORMAT_VERSION}; re-run the program to write it again"
        )
    report["_path"] = path
    return report


def find_reports(directory):
    """(reports oldest first, [problems]) of the report files under
    `directory` (recursively: Poplar tools write per-program subdirectories)."""
    paths = sorted(glob.glob(os.path.join(directory, "**", "*" + profile.SUFFIX),
                             recursive=True))
    reports, problems = [], []
    for path in paths:
        try:
            reports.append(load_report(path))
        except ReportError as e:
            problems.append(str(e))
    reports.sort(key=lambda r: (r.get("created", ""), r["_path"]))
    return reports, problems

"""python -m keras_ipu.report DIR: summarise and draw profile reports."""

import argparse
import os
import sys

from keras_ipu.report import charts as _charts
from keras_ipu.report import html_page
from keras_ipu.report import loading
from keras_ipu.report import summary as _summary


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m keras_ipu.report",
        description="Print a summary table of the keras_ipu profile reports in DIR "
                    "and draw their pictures (memory per tile, liveness over program "
                    "steps, predicted execution timeline) as PNG files and one "
                    "self-contained HTML page.",
        epilog=loading.HOW_TO,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", metavar="DIR", help="directory of profile reports "
                   "(the autoReport.directory the program ran with)")
    p.add_argument("--out", metavar="OUT", help="where to write the pictures and "
                   "index.html (default: DIR/report_pictures)")
    p.add_argument("--top", type=int, default=5, metavar="N",
                   help="ops and layers listed per report (default 5)")
    p.add_argument("--no-pictures", action="store_true",
                   help="print the summary only")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if not os.path.isdir(args.directory):
        print(f"keras_ipu.report: {args.directory!r} is not a directory.\n\n"
              f"{loading.HOW_TO}", file=sys.stderr)
        return 2
    reports, problems = loading.find_reports(args.directory)
    for problem in problems:
        print(f"keras_ipu.report: skipped {problem}", file=sys.stderr)
    if not reports:
        print(f"keras_ipu.report: no profile reports in {args.directory!r}.\n\n"
              f"{loading.HOW_TO}", file=sys.stderr)
        return 1
    print(_summary.summary(reports, args.top))
    if args.no_pictures:
        return 0
    out = args.out or os.path.join(args.directory, "report_pictures")
    os.makedirs(out, exist_ok=True)
    drawn = []
    for report in reports:
        stem = os.path.basename(report["_path"])[: -len(".json")]
        figures = []
        for kind, png, title in _charts.draw_all(report):
            with open(os.path.join(out, f"{stem}.{kind}.png"), "wb") as f:
                f.write(png)
            figures.append((kind, png, title))
        drawn.append(figures)
    index = os.path.join(out, "index.html")
    with open(index, "w", encoding="utf-8") as f:
        f.write(html_page.page(reports, drawn, args.top))
    n = sum(len(f) for f in drawn)
    print(f"\nWrote {n} pictures and {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

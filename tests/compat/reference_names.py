"""The names of Graphcore's Python API reference (chapter 21 of "Targeting
the IPU from TensorFlow 2", 004_*.txt of the project's reference folder).

`extract(text)` reads them from the reference text: every
`tensorflow.python.ipu.<path>` heading, and for a class the methods and
properties documented under it. reference_names.txt holds the result (the
reference itself is not part of the repository) plus the names whose
headings the text lost (the text keeps their description but drops the
signature line); test_reference_names.py checks that list against the
reference when the reference is at hand.
"""

import re
from pathlib import Path

PREFIX = "tensorflow.python.ipu."
LIST = Path(__file__).with_name("reference_names.txt")
LOST_MARK = "# names whose heading the reference text lost"

_HEADING = re.compile(r"^(class |static )?tensorflow\.python\.ipu\.([\w.]+)(\(|\s|$)")
_MEMBER = re.compile(r"^(?:property |static )?([A-Za-z_]\w*)(\(.*\))?\s*$")
# Words of code samples under a class that look like a member line.
_NOT_MEMBERS = {"print", "def"}


def extract(text):
    """Sorted public paths (without the tensorflow.python.ipu prefix)."""
    names = set()
    cls = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            name = heading.group(2)
            names.add(name)
            cls = name if heading.group(1) == "class " else None
            continue
        if line.startswith("21."):
            cls = None
            continue
        if cls is None:
            continue
        member = _MEMBER.match(line)
        if member is None or member.group(1) in _NOT_MEMBERS:
            continue
        if line.startswith(("property ", "static ")) or member.group(2):
            names.add(f"{cls}.{member.group(1)}")
    return sorted(names)


def read_list():
    """(names from the reference, names whose heading it lost)."""
    found, lost, into = [], [], None
    for line in LIST.read_text().splitlines():
        if line.startswith(LOST_MARK):
            into = lost
            continue
        line = line.split("#", 1)[0].strip()
        if line:
            (found if into is None else into).append(line)
    return found, lost

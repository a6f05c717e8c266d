"""A rule on the tests themselves: a test that asserts the host threads are
backing off (`threads.backing_off()` true) must hold the back-off's clock,
with the `long_backoff` fixture (a minute-long back-off) or by patching the
clock `threads` reads. On the real clock the back-off lasts 0.1 s, and a
busy machine that pauses the test between the late split and the assert
ends it first: s11review found six such checks that CI could fail."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Fixtures that hold the back-off open whatever the machine does.
HOLDING_FIXTURES = {"long_backoff"}
# monkeypatch.setattr(threads, NAME, ...) that replace the clock (or the
# check itself).
HOLDING_PATCHES = {"time", "perf_counter", "backing_off", "blocks_backing_off"}
# The back-offs' checks: the shared one and the scans' row blocks' own.
BACKING_OFF = {"backing_off", "blocks_backing_off"}


def _is_backing_off_call(node):
    return (isinstance(node, ast.Call) and not node.args
            and (getattr(node.func, "attr", None) in BACKING_OFF
                 or getattr(node.func, "id", None) in BACKING_OFF))


def _asserts_backing_off(assert_node):
    """Whether the assert needs a back-off in force: a backing_off() call in
    it other than under `not`."""
    negated = {id(n.operand) for n in ast.walk(assert_node.test)
               if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)}
    return any(_is_backing_off_call(n) and id(n) not in negated
               for n in ast.walk(assert_node.test))


def _holds_the_clock(function):
    arguments = {a.arg for a in function.args.args + function.args.kwonlyargs}
    if arguments & HOLDING_FIXTURES:
        return True
    for node in ast.walk(function):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in HOLDING_PATCHES):
            return True
    return False


def unheld_backoff_asserts(source, filename="<test>"):
    """(test name, line) of each assert that a back-off is in force in a
    test that does not hold its clock."""
    found = []
    for function in ast.parse(source, filename).body:
        if not (isinstance(function, ast.FunctionDef) and function.name.startswith("test")):
            continue
        if _holds_the_clock(function):
            continue
        found += [(function.name, node.lineno) for node in ast.walk(function)
                  if isinstance(node, ast.Assert) and _asserts_backing_off(node)]
    return found


def test_the_rule_finds_what_it_should():
    bad = ("def test_a(monkeypatch):\n"
           "    late_split()\n"
           "    assert threads._late == 1 and threads.backing_off()\n")
    assert unheld_backoff_asserts(bad) == [("test_a", 3)]
    held = bad.replace("(monkeypatch)", "(monkeypatch, long_backoff)")
    assert unheld_backoff_asserts(held) == []
    clock = bad.replace("    late_split()\n", "    monkeypatch.setattr(threads, 'time', fake)\n")
    assert unheld_backoff_asserts(clock) == []
    # That it is *not* backing off needs no clock.
    assert unheld_backoff_asserts(bad.replace("and threads.backing_off()",
                                              "and not threads.backing_off()")) == []
    assert unheld_backoff_asserts(bad.replace("threads.backing_off()",
                                              "threads.backing_off() is late")) == [("test_a", 3)]


def test_every_back_off_assert_holds_its_clock():
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        source = path.read_text()
        if "backing_off" in source:
            found += [(str(path.relative_to(TESTS)), name, line)
                      for name, line in unheld_backoff_asserts(source, str(path))]
    assert not found, (
        "tests that assert backing_off() on the real clock (0.1 s: a busy machine "
        f"ends it before the assert); give them the long_backoff fixture: {found}")

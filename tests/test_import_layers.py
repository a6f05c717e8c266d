"""The modules of keras_ipu/device import each other in layers: no cycle at
module level (importing a module of a package runs the package's
__init__ too, so those count), no function-level import of a keras_ipu
module (only heavy optional dependencies load lazily: LAZY_PACKAGES), no ImportError
guard around a module of this package, and no read of another module's
private names."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "keras_ipu"
LAYER = "keras_ipu.device"
# The C kernels are built at install time and may be missing (hatch_build.py).
OPTIONAL_MODULES = {"keras_ipu.device.native._elementwise",
                    "keras_ipu.device.native._scatter_add",
                    "keras_ipu.device.native._product_pool",
                    "keras_ipu.device.native._pooling",
                    "keras_ipu.device.native._im2col",
                    "keras_ipu.device.native._rows"}
# Packages that import a heavy library, loaded on first use (a function-level
# import): the TensorFlow emitter, which only the XLA engine needs, and the
# one module that talks to MPI, which only multi-process jobs load.
LAZY_PACKAGES = ("keras_ipu.device.to_tensorflow", "keras_ipu.distributed.mpi_world")


def _lazy(target):
    return any(target == p or target.startswith(p + ".") for p in LAZY_PACKAGES)


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}


def _is_package(name, modules):
    path = modules.get(name)
    return path is not None and path.name == "__init__.py"


def _absolute(node, name, modules):
    """The module an ImportFrom names (relative imports resolved)."""
    if not node.level:
        return node.module
    base = name if _is_package(name, modules) else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _imported(node, name, modules):
    """The keras_ipu modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    target = _absolute(node, name, modules)
    if target is None or target.split(".")[0] != PACKAGE:
        return []
    found = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        found.append(sub if sub in modules or sub in OPTIONAL_MODULES else target)
    return found


class _Imports(ast.NodeVisitor):
    """Import statements of a module, split by where they run."""

    def __init__(self):
        self.module_level = []  # run when the module is imported
        self.in_functions = []
        self.guarded = []  # inside try: ... except ImportError
        self._depth = 0

    def _function(self, node):
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node):
        (self.in_functions if self._depth else self.module_level).append(node)

    visit_Import = visit_ImportFrom = _import

    def visit_Try(self, node):
        catches = any(
            h.type is not None and "ImportError" in ast.unparse(h.type)
            or h.type is not None and "ModuleNotFoundError" in ast.unparse(h.type)
            for h in node.handlers
        )
        if catches:
            self.guarded.extend(n for stmt in node.body for n in ast.walk(stmt)
                                if isinstance(n, (ast.Import, ast.ImportFrom)))
        self.generic_visit(node)


def _parse(modules):
    parsed = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        imports = _Imports()
        imports.visit(tree)
        parsed[name] = (tree, imports)
    return parsed


def import_graph(modules, parsed, prefix):
    """{module: modules it loads when imported} among the modules under
    `prefix`: what its module-level imports name, and the packages above
    each of those outside its own package (their __init__ runs first)."""
    graph = {}
    for name in modules:
        if not name.startswith(prefix):
            continue
        edges = set()
        for node in parsed[name][1].module_level:
            for target in _imported(node, name, modules):
                parts = target.split(".")
                for k in range(1, len(parts) + 1):
                    pkg = ".".join(parts[:k])
                    inside = name == pkg or name.startswith(pkg + ".")
                    if pkg.startswith(prefix) and pkg in modules and not inside:
                        edges.add(pkg)
        graph[name] = edges - {name}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def device():
    modules = _modules()
    return modules, _parse(modules)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_device_layer(device):
    modules, parsed = device
    graph = import_graph(modules, parsed, LAYER)
    assert len(graph) > 50
    found = cycles(graph)
    shown = [" -> ".join(c) for c in found]
    assert found == [], "import cycles in keras_ipu/device:\n" + "\n".join(shown)


def test_function_level_imports_are_only_of_other_libraries(device):
    modules, parsed = device
    found = [
        f"{name}: {ast.unparse(node)}"
        for name, (_, imports) in parsed.items() if name.startswith(LAYER)
        for node in imports.in_functions
        if [t for t in _imported(node, name, modules) if not _lazy(t)]
    ]
    assert found == []


def test_no_import_error_guard_around_our_modules(device):
    modules, parsed = device
    found = [
        f"{name}: {ast.unparse(node)}"
        for name, (_, imports) in parsed.items() if name.startswith(LAYER)
        for node in imports.guarded
        if set(_imported(node, name, modules)) - OPTIONAL_MODULES
    ]
    assert found == []


def test_no_read_of_another_modules_private_names(device):
    modules, parsed = device
    found = []
    for name, (tree, _) in parsed.items():
        if not name.startswith(LAYER):
            continue
        aliases = {}  # local name -> keras_ipu module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(node, name, modules)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    # A module of the package named with "_" (keras_ipu._atomic_files)
                    # is internal to the package, not another module's state.
                    if (target or "").split(".")[0] == PACKAGE and sub not in OPTIONAL_MODULES and (
                            sub not in modules
                            and alias.name.startswith("_") and not alias.name.startswith("__")):
                        found.append(f"{name}: from {target} import {alias.name}")
                    if sub in modules:
                        aliases[alias.asname or alias.name] = sub
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"{name}: {node.value.id}.{node.attr}")
    assert found == []

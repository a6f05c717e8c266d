"""The installed package and its import hook, seen from fresh interpreters.

Each check runs in a subprocess because what it tests happens at
interpreter start-up (the .pth hook) or at the first `import keras`.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

from keras_ipu import _hook

HEAVY_FRAMEWORKS = ("tensorflow", "jax", "torch", "scipy")


def run_python(code, backend):
    env = dict(os.environ)
    if backend is None:
        env.pop("KERAS_BACKEND", None)
    else:
        env["KERAS_BACKEND"] = backend
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"subprocess failed (KERAS_BACKEND={backend}):\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def test_hook_is_installed_at_startup():
    out = run_python(
        """
        import sys
        print(any(type(f).__name__ == "IPUBackendFinder" for f in sys.meta_path))
        print("keras" in sys.modules)
        """,
        backend=None,
    )
    assert out.split() == ["True", "False"]


def test_keras_ops_add_runs_on_ipu():
    out = run_python(
        "import keras; print(keras.ops.add(1, 2))", backend="ipu"
    )
    assert out.strip() == "3", out


def test_keras_reports_ipu_backend():
    out = run_python(
        """
        import keras
        from keras.src.backend import standardize_dtype
        print(keras.backend.backend())
        print(type(keras.ops.ones((2,))).__module__)
        """,
        backend="ipu",
    )
    backend_name, tensor_module = out.split()
    assert backend_name == "ipu"
    assert tensor_module.startswith("keras_ipu.")


# Which frameworks a statement imports, and the file whose import statement
# first loaded each (the innermost frame outside importlib).
IMPORT_SPY = """
import json, sys, traceback
HEAVY = {heavy!r}
importers = {{}}

class Spy:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HEAVY and top not in importers:
            importers[top] = [
                f.filename for f in traceback.extract_stack()[:-1]
                if not f.filename.startswith("<frozen")
            ][-1]
        return None

sys.meta_path.insert(0, Spy())
{statement}
print(json.dumps({{m: importers.get(m, "?") for m in HEAVY if m in sys.modules}}))
"""


@pytest.mark.parametrize(
    "statement",
    [
        "import keras_ipu",
        "import keras",
        "import keras; keras.ops.add(1, 2)",
        # Before keras: the backend package steps aside for Keras' import.
        "import keras_ipu.backend",
    ],
)
def test_import_loads_no_other_framework(statement):
    out = run_python(
        IMPORT_SPY.format(heavy=HEAVY_FRAMEWORKS, statement=statement),
        backend="ipu",
    )
    imported = json.loads(out.strip().splitlines()[-1])
    for module, importer in imported.items():
        assert "/keras_ipu/" not in importer, (module, importer)
    # Keras itself imports jax, when it is installed, on every backend
    # (keras/src/callbacks/orbax_checkpoint.py patches jax.monitoring);
    # the test extras install jax for Keras' own tests. Nothing else may load.
    if "jax" in imported:
        assert imported.pop("jax").endswith("orbax_checkpoint.py")
    assert imported == {}


def test_other_backend_is_left_alone():
    out = run_python(
        """
        import sys
        import keras
        import keras.src.backend as kb
        print(keras.backend.backend())
        print(any(m == "keras_ipu.backend" or m.startswith("keras_ipu.backend.")
                  for m in sys.modules))
        print(type(kb.__loader__).__name__)
        """,
        backend="tensorflow",
    )
    backend_name, ipu_loaded, loader = out.split()
    assert backend_name == "tensorflow"
    assert ipu_loaded == "False"
    assert loader != "_PatchingLoader"


# ---------------------------------------------------------------------------
# The hook's guard against a Keras whose source no longer has the expected
# shape: it must fail loudly and name the supported version.


def _expect_version_error(patch, source, module_name):
    with pytest.raises(_hook.KerasVersionError) as info:
        patch(ast.parse(source), module_name)
    message = str(info.value)
    assert _hook.SUPPORTED_KERAS == "3.15"
    assert "Keras 3.15" in message
    assert module_name in message
    return message


@pytest.mark.parametrize("module_name", sorted(_hook._CHAIN_BRANCHES))
def test_missing_backend_chain_names_supported_version(module_name):
    source = 'import os\nif os.name == "tensorflow":\n    x = 1\n'
    message = _expect_version_error(
        lambda tree, name: _hook.add_chain_branch(tree, name, "pass\n"),
        source,
        module_name,
    )
    assert "backend()" in message


@pytest.mark.parametrize(
    "source",
    [
        "class Other:\n    pass\n",
        "class DynamicBackend:\n    def set_backend(self, b):\n        pass\n",
        textwrap.dedent(
            """
            class DynamicBackend:
                def set_backend(self, backend):
                    if backend not in ("tensorflow", "jax"):
                        raise ValueError(backend)
                def __getattr__(self, name):
                    pass
            """
        ),
    ],
    ids=["no-class", "no-getattr", "no-backend-list"],
)
def test_changed_backend_utils_names_supported_version(source):
    _expect_version_error(_hook._patch_backend_utils, source, _hook._BACKEND_UTILS)


def _installed_keras_source(module_name):
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    parent, _, _ = module_name.rpartition(".")
    spec = PathFinder.find_spec(module_name, find_spec(parent).submodule_search_locations)
    return spec.loader.get_source(module_name)


@pytest.mark.parametrize("module_name", sorted(_hook._CHAIN_BRANCHES))
def test_installed_keras_chain_gets_an_ipu_branch(module_name):
    tree = ast.parse(_installed_keras_source(module_name))
    _hook.add_chain_branch(tree, module_name, _hook._CHAIN_BRANCHES[module_name])
    compares = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare)
        and isinstance(n.comparators[0], ast.Constant)
        and n.comparators[0].value == "ipu"
    ]
    assert len(compares) == 1


def test_installed_backend_utils_accepts_ipu():
    tree = ast.parse(_installed_keras_source(_hook._BACKEND_UTILS))
    _hook._patch_backend_utils(tree, _hook._BACKEND_UTILS)
    names = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value == "ipu"
    ]
    assert len(names) >= 2  # the accepted names and the __getattr__ branch


@pytest.mark.parametrize(
    "module_name, patch, expected",
    [
        (_hook._TENSORBOARD_CALLBACK, _hook._patch_tensorboard_callback,
         ["jax", "tensorflow", "ipu"]),
        (_hook._EQUALIZATION, _hook._patch_equalization, ["jax", "openvino", "ipu"]),
    ],
    ids=["tensorboard", "equalization"],
)
def test_installed_backend_name_tuple_gets_ipu(module_name, patch, expected):
    tree = ast.parse(_installed_keras_source(module_name))
    patch(tree, module_name)
    tuples = [
        [e.value for e in n.elts]
        for n in ast.walk(tree)
        if isinstance(n, ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value == "ipu" for e in n.elts)
    ]
    assert tuples == [expected]


def test_changed_equalization_names_supported_version():
    source = "def f(self):\n    if self.backend.name == 'jax':\n        pass\n"
    _expect_version_error(_hook._patch_equalization, source, _hook._EQUALIZATION)


def test_equalization_compiles_and_matches_eager():
    # Keras' layer used ops.nonzero here (a value-dependent shape) on every
    # backend but jax and openvino; under ipu it takes their argmax branch.
    import keras
    import numpy as np

    from keras_ipu.device.jit import jit

    x = np.random.default_rng(0).uniform(0, 255, (8, 6, 6, 3)).astype("float32")
    layer = keras.layers.Equalization()
    compiled = jit(lambda v: layer(v, training=True))(x)
    eager = keras.ops.convert_to_numpy(layer(x, training=True))
    np.testing.assert_allclose(compiled, eager, rtol=1e-6)
    assert not np.array_equal(eager, x)  # it equalised


def test_chain_starting_with_another_backend_gets_the_branch_before_else():
    tree = ast.parse(
        "if backend.backend() == 'jax':\n    T = 1\n"
        "elif backend.backend() == 'torch':\n    T = 2\n"
        "else:\n    raise ImportError('Invalid backend')\n"
    )
    _hook.add_chain_branch(tree, "some_test", "T = 'ipu'\n")
    namespace = {"backend": type("B", (), {"backend": staticmethod(lambda: "ipu")})}
    exec(compile(ast.fix_missing_locations(tree), "<t>", "exec"), namespace)
    assert namespace["T"] == "ipu"
    namespace["backend"].backend = staticmethod(lambda: "other")
    with pytest.raises(ImportError, match="Invalid backend"):
        exec(compile(tree, "<t>", "exec"), namespace)

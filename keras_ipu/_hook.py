"""Teaches an unmodified Keras the backend name "ipu".

Keras chooses its backend-specific classes with `if backend() == "..."`
chains in a handful of modules, and fails for names it does not know. A
`.pth` file shipped with keras_ipu calls `install()` at interpreter start-up;
it puts a meta-path finder in front of the normal one. The finder does
nothing until one of those few Keras modules is imported *and* the selected
backend is "ipu" (read at that moment, so `os.environ["KERAS_BACKEND"]` set in
a script before `import keras` works too). Then it loads that module from its
own source with one extra `elif backend() == "ipu":` branch added to the AST.
No file in site-packages is changed; with any other backend it returns None.

This module must stay cheap to import: it runs in every Python process.
"""

import sys

SUPPORTED_KERAS = "3.15"

# module -> the body of the branch added for "ipu" in its backend if-chain.
_CHAIN_BRANCHES = {
    "keras.src.backend": (
        "from keras_ipu.backend import *\n"
        "from keras_ipu.backend.core import Variable as BackendVariable\n"
    ),
    "keras.src.layers.layer": (
        "from keras_ipu.backend.layer import IPULayer as BackendLayer\n"
    ),
    "keras.src.models.model": (
        "from keras_ipu.backend.trainer import IPUTrainer as Trainer\n"
    ),
    "keras.src.optimizers.optimizer": (
        "from keras_ipu.backend.trainer_ops.optimizer import IPUOptimizer "
        "as BackendOptimizer\n"
    ),
    "keras.src.export.saved_model": (
        "from keras_ipu.backend.export import IPUExportArchive "
        "as BackendSavedModelExportArchive\n"
    ),
}
_BACKEND_UTILS = "keras.src.utils.backend_utils"
# TensorBoard(profile_batch=...) refuses backends outside a tuple of names;
# keras_ipu.backend.tensorboard provides the profiler it needs.
_TENSORBOARD_CALLBACK = "keras.src.callbacks.tensorboard"
# Equalization finds a histogram's first non-empty bin with nonzero (a
# value-dependent shape) except on the backends listed beside "openvino".
_EQUALIZATION = "keras.src.layers.preprocessing.image_preprocessing.equalization"


# Keras writes its model files in place: a kill during a save destroys the
# previous file. Under "ipu" these writers go through
# keras_ipu._atomic_files.writes_atomically (module -> function ->
# the condition, on (args, kwargs) after (model, filepath), for the call
# to write one local file; None: always).
_ATOMIC_SAVES = {
    "keras.src.saving.saving_lib": {
        # zipped=False writes a directory.
        "save_model": "lambda args, kwargs: kwargs.get('zipped', args[1] if len(args) > 1 else True)",
        # max_shard_size writes several files.
        "save_weights_only": "lambda args, kwargs: kwargs.get('max_shard_size', args[0] if args else None) is None",
    },
    "keras.src.legacy.saving.legacy_h5_format": {
        "save_model_to_hdf5": "None",
    },
}


# Files Keras writes in place with `file_utils.File(path, "w")` inside a
# method (module -> (class, method)): under "ipu" those opens write a
# temporary file renamed when the block ends, so a kill leaves the
# previous content (a torn training_metadata.json makes every later
# BackupAndRestore fit fail with a JSON error).
_ATOMIC_OPENS = {
    "keras.src.callbacks.backup_and_restore": ("BackupAndRestore", "_save_model"),
}


class KerasVersionError(ImportError):
    pass


def _selected_backend():
    # keras.src.backend.config is imported before our other targets (they
    # all import it), so asking it is both correct and free.
    config = sys.modules.get("keras.src.backend.config")
    if config is not None:
        return config.backend()
    # keras.src.backend itself is found before its config module runs:
    # decide as that module will.
    return _keras_config_backend()


def _keras_config_backend():
    """The backend keras.src.backend.config will choose: KERAS_BACKEND when
    set and not empty, else "backend" of keras.json in KERAS_HOME (or
    ~/.keras, or /tmp/.keras when the home directory is not writable),
    else "tensorflow" (Keras 3.15's rules, read without importing Keras)."""
    import os

    chosen = os.environ.get("KERAS_BACKEND")
    if chosen:
        return chosen
    if "KERAS_HOME" in os.environ:
        keras_dir = os.environ.get("KERAS_HOME")
    else:
        base = os.path.expanduser("~")
        if not os.access(base, os.W_OK):
            base = "/tmp"
        keras_dir = os.path.join(base, ".keras")
    path = os.path.expanduser(os.path.join(keras_dir, "keras.json"))
    try:
        import json

        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):  # Keras ignores an unreadable file too
        return "tensorflow"
    backend = config.get("backend", "tensorflow") if isinstance(config, dict) else None
    return backend if isinstance(backend, str) else "tensorflow"


def _version_error(module_name, what):
    try:
        from importlib.metadata import version

        found = version("keras")
    except Exception:  # pragma: no cover - metadata missing
        found = "unknown"
    return KerasVersionError(
        f"keras_ipu cannot add the 'ipu' backend to Keras {found}: {what} "
        f"was not found in `{module_name}`. keras_ipu supports Keras "
        f"{SUPPORTED_KERAS}.x; install it with `pip install "
        f"'keras>={SUPPORTED_KERAS}.1,<3.16'` or select another backend."
    )


KERAS_BACKENDS = frozenset({"tensorflow", "jax", "torch", "numpy", "openvino"})


def is_backend_compare(test, names=KERAS_BACKENDS):
    """True for `<...>.backend() == "name"` / `backend() == "name"` with a
    name in `names` (by default the backends Keras knows)."""
    import ast

    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.left, ast.Call)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value in names
    )


def _chain(stmt):
    """The `if`s of an if/elif chain, in order."""
    import ast

    links = [stmt]
    while len(links[-1].orelse) == 1 and isinstance(links[-1].orelse[0], ast.If):
        links.append(links[-1].orelse[0])
    return links


def add_chain_branch(tree, module_name, branch_source):
    """Adds `elif backend() == "ipu": <branch_source>` to the first
    module-level `if backend() == ...` chain of `tree` that dispatches on
    two or more backends (a lone `if backend() == "torch": import torch`
    is not a dispatch), before its `else`."""
    import ast

    for stmt in tree.body:
        if not isinstance(stmt, ast.If):
            continue
        links = _chain(stmt)
        compares = [link.test for link in links if is_backend_compare(link.test)]
        if len(compares) < 2:
            continue
        test = ast.Compare(
            left=compares[0].left, ops=[ast.Eq()], comparators=[ast.Constant("ipu")]
        )
        body = ast.parse(branch_source).body
        last = links[-1]
        last.orelse = [ast.If(test=test, body=body, orelse=last.orelse)]
        return
    raise _version_error(module_name, 'the `if backend() == "..."` chain')


def _patch_backend_utils(tree, module_name):
    import ast

    cls = next(
        (
            s
            for s in tree.body
            if isinstance(s, ast.ClassDef) and s.name == "DynamicBackend"
        ),
        None,
    )
    if cls is None:
        raise _version_error(module_name, "class DynamicBackend")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    if "set_backend" not in methods or "__getattr__" not in methods:
        raise _version_error(module_name, "DynamicBackend.set_backend")
    found = False
    for node in ast.walk(methods["set_backend"]):
        if isinstance(node, ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value == "numpy" for e in node.elts
        ):
            node.elts.append(ast.Constant("ipu"))
            found = True
    if not found:
        raise _version_error(module_name, "the list of backend names")
    getattr_fn = methods["__getattr__"]
    getattr_fn.body[:0] = ast.parse(
        # A local `import importlib` would shadow the module-level name in
        # the whole method and break the other backends' branches.
        "if self._backend == 'ipu':\n"
        "    from importlib import import_module as _import_ipu_backend\n"
        "    return getattr(_import_ipu_backend('keras_ipu.backend'), name)\n"
    ).body


def _add_ipu_to_name_tuple(scope, module_name, op, anchor, what):
    """Adds "ipu" to the tuple of backend names in `<...> in (...)` (or
    `not in`, by `op`) that holds `anchor`, inside the AST `scope`: the
    branch Keras would take for one more backend of that kind."""
    import ast

    for node in ast.walk(scope):
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], op)
            and isinstance(node.left, (ast.Call, ast.Attribute))
            and isinstance(node.comparators[0], ast.Tuple)
            and any(
                isinstance(e, ast.Constant) and e.value == anchor
                for e in node.comparators[0].elts
            )
        ):
            node.comparators[0].elts.append(ast.Constant("ipu"))
            return
    raise _version_error(module_name, what)


def _patch_tensorboard_callback(tree, module_name):
    """Adds "ipu" to the `backend.backend() not in ("jax", "tensorflow")`
    tuple of TensorBoard.__init__ (the backends that can profile)."""
    import ast

    cls = next(
        (
            s
            for s in tree.body
            if isinstance(s, ast.ClassDef) and s.name == "TensorBoard"
        ),
        None,
    )
    init = next(
        (f for f in getattr(cls, "body", ()) if isinstance(f, ast.FunctionDef)
         and f.name == "__init__"),
        None,
    )
    if init is None:
        raise _version_error(module_name, "TensorBoard.__init__")
    _add_ipu_to_name_tuple(
        init, module_name, ast.NotIn, "tensorflow",
        'the `backend.backend() not in ("jax", "tensorflow")` check',
    )


def _patch_equalization(tree, module_name):
    """Adds "ipu" to Equalization's `self.backend.name in ("jax", "openvino")`:
    the first non-empty histogram bin found with argmax (a static shape)
    rather than nonzero, which no compiled IPU program can have."""
    import ast

    _add_ipu_to_name_tuple(
        tree, module_name, ast.In, "openvino",
        'the `self.backend.name in ("jax", "openvino")` check',
    )


def _make_saves_atomic(tree, module_name):
    """Rebinds the module's save functions of _ATOMIC_SAVES, after their
    definitions, to atomic versions of themselves."""
    import ast

    functions = _ATOMIC_SAVES[module_name]
    defined = {
        s.name for s in tree.body if isinstance(s, ast.FunctionDef)
    }
    for name in functions:
        if name not in defined:
            raise _version_error(module_name, f"the function {name}")
    lines = ["from keras_ipu._atomic_files import writes_atomically as _ipu_atomic"]
    lines += [
        f"{name} = _ipu_atomic({name}, {condition})"
        for name, condition in functions.items()
    ]
    tree.body.extend(ast.parse("\n".join(lines)).body)


def _make_opens_atomic(tree, module_name):
    """Replaces `file_utils.File(path, "w")` in the method of
    _ATOMIC_OPENS by keras_ipu._atomic_files.open_atomically(path, "w",
    file_utils.File)."""
    import ast

    class_name, method_name = _ATOMIC_OPENS[module_name]
    replaced = 0
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == class_name):
            continue
        for method in cls.body:
            if not (isinstance(method, ast.FunctionDef) and method.name == method_name):
                continue
            for node in ast.walk(method):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "File"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "file_utils"
                    and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value == "w"
                ):
                    continue
                node.args.append(node.func)
                node.func = ast.Name("_ipu_open_atomically", ast.Load())
                replaced += 1
    if not replaced:
        raise _version_error(
            module_name, f'`file_utils.File(..., "w")` in {class_name}.{method_name}'
        )
    tree.body.extend(ast.parse(
        "from keras_ipu._atomic_files import open_atomically as _ipu_open_atomically"
    ).body)


def _runtime_transforms():
    """module name -> transform(tree, module_name) for Keras' own modules."""
    transforms = {
        name: (lambda tree, module_name: add_chain_branch(
            tree, module_name, _CHAIN_BRANCHES[module_name]))
        for name in _CHAIN_BRANCHES
    }
    transforms[_BACKEND_UTILS] = _patch_backend_utils
    transforms[_TENSORBOARD_CALLBACK] = _patch_tensorboard_callback
    transforms[_EQUALIZATION] = _patch_equalization
    for name in _ATOMIC_SAVES:
        transforms[name] = _make_saves_atomic
    for name in _ATOMIC_OPENS:
        transforms[name] = _make_opens_atomic
    return transforms


class _PatchingLoader:
    def __init__(self, name, original_loader, transform):
        self.name = name
        self.original = original_loader
        self.transform = transform

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import ast

        source = self.original.get_source(self.name)
        filename = self.original.get_filename(self.name)
        tree = ast.parse(source, filename)
        self.transform(tree, self.name)
        ast.fix_missing_locations(tree)
        exec(compile(tree, filename, "exec"), module.__dict__)

    # importlib.resources and linecache ask loaders for source.
    def get_source(self, name):
        return self.original.get_source(name)

    def get_filename(self, name):
        return self.original.get_filename(name)


class IPUBackendFinder:
    """Meta-path finder that, when the backend is "ipu", loads the modules
    of `transforms` (module name -> transform(ast_tree, module_name)) from
    their own source with the transform applied; by default Keras' dispatch
    modules get their "ipu" branch."""

    def __init__(self, transforms=None):
        self.runtime = transforms is None
        self.transforms = _runtime_transforms() if self.runtime else transforms

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.transforms and _selected_backend() == "ipu":
            transform = self.transforms[fullname]
        elif (self.runtime and fullname in _TF_TRANSFORMS
              and _selected_backend() == "tensorflow" and _tf_hook_enabled()):
            transform = _TF_TRANSFORMS[fullname]
        else:
            return None
        from importlib.machinery import PathFinder
        from importlib.util import spec_from_loader

        original = PathFinder.find_spec(fullname, path)
        if original is None or original.loader is None:
            return None
        is_package = original.submodule_search_locations is not None
        spec = spec_from_loader(
            fullname,
            _PatchingLoader(fullname, original.loader, transform),
            origin=original.origin,
            is_package=is_package,
        )
        if is_package:
            spec.submodule_search_locations = list(
                original.submodule_search_locations
            )
        spec.has_location = True
        return spec


# `from tensorflow.python import ipu` (Graphcore's SDK) resolves to keras_ipu:
# stock TensorFlow has no `tensorflow.python.ipu`, so no module of
# TensorFlow's is shadowed. And under KERAS_BACKEND=tensorflow, Keras'
# TensorFlow trainer gets the IPUStrategy hooks (_patch_tensorflow_trainer).
# KERAS_IPU_TF_HOOK=0 turns both off.
TF_IPU = "tensorflow.python.ipu"
TF_HOOK_ENV = "KERAS_IPU_TF_HOOK"
_TF_TRAINER = "keras.src.backend.tensorflow.trainer"
_TF_LAYER = "keras.src.backend.tensorflow.layer"


def _tf_hook_enabled():
    import os

    return os.environ.get(TF_HOOK_ENV, "1") != "0"


def _patch_tensorflow_trainer(tree, module_name):
    """Keras' TensorFlowTrainer: a model made in an IPUStrategy scope is
    attached to it (end of __init__), and its make_train/test/predict_function
    compile through keras_ipu's TensorFlow front end
    (keras_ipu/frontends/tensorflow/keras_trainer.py)."""
    import ast

    cls = next((s for s in tree.body if isinstance(s, ast.ClassDef)
                and s.name == "TensorFlowTrainer"), None)
    methods = {f.name: f for f in getattr(cls, "body", ()) if isinstance(f, ast.FunctionDef)}
    wanted = ("__init__", "make_train_function", "make_test_function", "make_predict_function")
    if any(name not in methods for name in wanted):
        raise _version_error(module_name, "TensorFlowTrainer and its make_*_function methods")

    def located(source, method):
        # Tracebacks point at the method the statements were added to.
        body = ast.parse(source).body
        for node in body:
            for sub in ast.walk(node):
                ast.copy_location(sub, method)
        return body

    init = methods["__init__"]
    init.body.extend(located(
        "from keras_ipu.frontends.tensorflow import keras_trainer as _keras_ipu_trainer\n"
        "_keras_ipu_trainer.on_model_created(self)\n", init))
    for name in wanted[1:]:
        methods[name].body[:0] = located(
            "if getattr(self, '_ipu_tf_strategy', None) is not None:\n"
            "    from keras_ipu.frontends.tensorflow import keras_trainer as _keras_ipu_trainer\n"
            f"    return _keras_ipu_trainer.{name}(self, force)\n", methods[name])


def _patch_tensorflow_layer(tree, module_name):
    """Keras' TFLayer records the stage of Graphcore's PipelineStage
    context, as the ipu backend's layer does (keras_ipu/models/layer_stages.py):
    a tf.keras model made with PipelineStage scopes is pipelined."""
    import ast

    if not any(isinstance(s, ast.ClassDef) and s.name == "TFLayer" for s in tree.body):
        raise _version_error(module_name, "class TFLayer")
    tree.body.extend(ast.parse(
        "from keras_ipu.models.layer_stages import with_layer_stages as _ipu_layer_stages\n"
        "TFLayer = _ipu_layer_stages(TFLayer)\n").body)


_TF_TRANSFORMS = {_TF_TRAINER: _patch_tensorflow_trainer, _TF_LAYER: _patch_tensorflow_layer}


class _AliasLoader:
    """Loads an alias (`tensorflow.python.ipu[.X]`, MODULE_ALIASES) as the
    keras_ipu module itself (one module object under both names)."""

    def __init__(self, target):
        self.target = target
        self._own_spec = None

    def create_module(self, spec):
        from importlib import import_module

        module = import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system gave the module the alias's spec; keras_ipu's
        # own spec (its name, its loader) stays what it was.
        module.__spec__ = self._own_spec


# Zero-edit porting: the other modules Graphcore's users import resolve to
# keras_ipu's (alias -> keras_ipu module; the longest alias that is the
# imported name or a parent of it wins, its submodules follow the same
# path). `keras.ipu` is the module of Graphcore's Keras fork (Keras 3 has
# none: a submodule is added, nothing of Keras is replaced); popdist and
# ipu_tensorflow_addons only when no real package of that name is
# installed (Graphcore's SDK environment keeps its own).
MODULE_ALIASES = {
    TF_IPU: "keras_ipu",
    "keras.ipu": "keras_ipu.keras",
    "tensorflow.keras.ipu": "keras_ipu.keras",
    "ipu_tensorflow_addons": "keras_ipu.addons",
    "ipu_tensorflow_addons.keras.layers": "keras_ipu.layers",
    "ipu_tensorflow_addons.keras.optimizers": "keras_ipu.optimizers",
    "popdist": "keras_ipu.popdist",
}
_ONLY_WHEN_MISSING = ("ipu_tensorflow_addons", "popdist")


def alias_target(fullname):
    """The keras_ipu module `fullname` stands for, or None."""
    best = None
    for alias in MODULE_ALIASES:
        if fullname == alias or fullname.startswith(alias + "."):
            if best is None or len(alias) > len(best):
                best = alias
    if best is None:
        return None
    return MODULE_ALIASES[best] + fullname[len(best):]


class TensorFlowIPUAlias:
    """Meta-path finder: the modules of MODULE_ALIASES (`tensorflow.python.ipu`
    and its submodules first of all) are keras_ipu's modules."""

    def find_spec(self, fullname, path=None, target=None):
        name = alias_target(fullname)
        if name is None or not _tf_hook_enabled():
            return None
        from importlib.machinery import PathFinder
        from importlib.util import find_spec
        from importlib.util import spec_from_loader

        top = fullname.partition(".")[0]
        if top in _ONLY_WHEN_MISSING and PathFinder.find_spec(top) is not None:
            return None
        try:
            found = find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return None
        is_package = found.submodule_search_locations is not None
        spec = spec_from_loader(fullname, _AliasLoader(name), is_package=is_package)
        if is_package:
            spec.submodule_search_locations = list(found.submodule_search_locations)
        return spec


# Attributes of modules that Graphcore's code reads without importing them:
# `keras.ipu.PipelineStage` after `import tensorflow.keras as keras` (which
# is Keras' keras._tf_keras.keras) or `import keras`; `tf.estimator`, which
# TensorFlow 2.16 removed (keras_ipu offers the names an IPUEstimator model
# function uses, keras_ipu/estimators/tf_estimator.py). Each is a module
# __getattr__ (PEP 562), so it loads on first use and a real attribute of
# that name always wins.
MODULE_ATTRIBUTES = {
    "keras": {"ipu": "keras.ipu"},
    "keras._tf_keras.keras": {"ipu": "keras.ipu"},
    # TensorFlow loads keras/_tf_keras/keras a second time as
    # `tensorflow.keras` (its __path__ includes that folder) once keras is
    # imported.
    "tensorflow.keras": {"ipu": "keras.ipu"},
    "tensorflow": {"estimator": "keras_ipu.estimators.tf_estimator"},
}


def add_lazy_attributes(module, attributes):
    """Gives `module` the attributes {name: module to import}, loaded on
    first use, in front of its own __getattr__ (if any)."""
    previous = module.__dict__.get("__getattr__")

    def __getattr__(name):
        target = attributes.get(name)
        if target is not None:
            from importlib import import_module

            return import_module(target)
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__


class ModuleAttributesHook:
    """Meta-path finder: the modules of MODULE_ATTRIBUTES, loaded as they
    are, then given their attributes."""

    def find_spec(self, fullname, path=None, target=None):
        attributes = MODULE_ATTRIBUTES.get(fullname)
        if attributes is None or not _tf_hook_enabled():
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenLoader(spec.loader,
                                  lambda module: add_lazy_attributes(module, attributes))
        return spec


# TensorFlow's profiler (tf.profiler.experimental.start/stop, Keras'
# TensorBoard under the tensorflow backend) also records the IPU programs of
# the TensorFlow front end and writes their planes into its XSpace
# (keras_ipu/frontends/tensorflow/profiler.py). KERAS_IPU_TF_HOOK=0 turns it
# off too.
TF_PROFILER = "tensorflow.python.profiler.profiler_v2"


class _ThenLoader:
    """Runs a module's own loader, then `after(module)`."""

    def __init__(self, original, after):
        self.original = original
        self.after = after

    def create_module(self, spec):
        return self.original.create_module(spec)

    def exec_module(self, module):
        self.original.exec_module(module)
        self.after(module)

    def get_source(self, name):
        return self.original.get_source(name)

    def get_filename(self, name):
        return self.original.get_filename(name)

    def __getattr__(self, name):
        # The rest of the loader's protocol (resource readers, get_code) is
        # the original's.
        return getattr(self.original, name)


def _wrap_tensorflow_profiler(module):
    from keras_ipu.frontends.tensorflow import profiler

    profiler.wrap(module)


class TensorFlowProfilerHook:
    """Meta-path finder: TensorFlow's profiler_v2 module, loaded as it is,
    then wrapped (see TF_PROFILER)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TF_PROFILER or not _tf_hook_enabled():
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenLoader(spec.loader, _wrap_tensorflow_profiler)
        return spec


def install():
    if not any(isinstance(f, TensorFlowProfilerHook) for f in sys.meta_path):
        sys.meta_path.insert(0, TensorFlowProfilerHook())
    if not any(
        isinstance(f, IPUBackendFinder) and f.runtime for f in sys.meta_path
    ):
        sys.meta_path.insert(0, IPUBackendFinder())
    if not any(isinstance(f, TensorFlowIPUAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, TensorFlowIPUAlias())
    if not any(isinstance(f, ModuleAttributesHook) for f in sys.meta_path):
        sys.meta_path.insert(0, ModuleAttributesHook())

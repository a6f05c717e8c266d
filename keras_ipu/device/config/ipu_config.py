"""IPUConfig: the nested, typed, self-checking configuration object.

The tree comes from attribute_table.py. Every IPUConfig holds its values in one
flat dict keyed by full name ("ipu_model.tiles_per_ipu"); category objects are
views into it, so copying or comparing a config is copying or comparing a dict.
"""

import copy
import difflib
import json
import warnings

from keras_ipu.device.config import attribute_table
from keras_ipu.device.enums import ENUMS, StochasticRoundingBehaviour
from keras_ipu.device.config.metadata import (
    AttributeMetadata,
    IPUConfigDeprecationWarning,
    normalize_value,
)

# Deprecated names that are aliases of a moved option: both read and write the
# same value. (The reference's deprecation text names the new place.)
_ALIASES = {"optimizations.enable_fast_math": "optimizations.math.fast"}

# Older SDKs took a bool for floating_point_behaviour.esr; ported scripts still
# do, so it is converted (with a warning) rather than refused.
_LEGACY_VALUES = {
    "floating_point_behaviour.esr": (
        bool,
        lambda v: StochasticRoundingBehaviour.ON if v else StochasticRoundingBehaviour.OFF,
        "floating_point_behaviour.esr = True/False is deprecated: use "
        "StochasticRoundingBehaviour.ON or StochasticRoundingBehaviour.OFF.",
    ),
}


class IPUConfigAttributeError(AttributeError, ValueError):
    """A name that is not in the IPUConfig tree.

    An AttributeError for Python (hasattr works), and a ValueError because that
    is what Graphcore's IPUConfig raises, so ported `except ValueError` still works.
    """


def _build_schema():
    metadata = {"": AttributeMetadata("", "The root of the IPU configuration.")}
    children = {"": {}}
    for name, doc in attribute_table.CATEGORIES:
        metadata[name] = AttributeMetadata(name, doc)
        children[name] = {}
    for name, type_name, default, doc, deprecated_msg in attribute_table.ATTRIBUTES:
        metadata[name] = AttributeMetadata(name, doc, type_name, default, deprecated_msg)
    # Options before sub-categories, each in reference order, as the reference
    # lists them.
    ordered = sorted((n for n in metadata if n), key=lambda n: metadata[n].is_category)
    for name in ordered:
        parent, _, leaf = name.rpartition(".")
        children[parent][leaf] = name
    for alias, target in _ALIASES.items():
        assert metadata[alias].deprecated and metadata[target].type == metadata[alias].type
    return metadata, children


_METADATA, _CHILDREN = _build_schema()
OPTION_NAMES = tuple(
    n for n, m in _METADATA.items() if n and not m.is_category and n not in _ALIASES
)


def _join(path, leaf):
    return f"{path}.{leaf}" if path else leaf


def _unknown_attribute(path, leaf):
    """AttributeError for a misspelled name, naming the closest valid option."""
    full = _join(path, leaf)
    local = list(_CHILDREN[path])
    guess = difflib.get_close_matches(leaf, local, n=1, cutoff=0.6)
    if guess:
        suggestion = _join(path, guess[0])
    else:
        # Perhaps the right name at the wrong level (config.tiles_per_ipu).
        everywhere = {n.rpartition(".")[2]: n for n in _METADATA if n}
        guess = difflib.get_close_matches(leaf, list(everywhere), n=1, cutoff=0.6)
        suggestion = everywhere[guess[0]] if guess else None
    msg = f"IPUConfig has no attribute '{full}'."
    if suggestion is not None:
        meta = _METADATA[suggestion]
        kind = "category" if meta.is_category else f"option of type {meta.type}"
        msg += f" Did you mean '{suggestion}' ({kind})?"
    else:
        msg += f" Valid names here: {', '.join(sorted(local))}."
    return IPUConfigAttributeError(msg)


class _Category:
    """A view on the options under one category path of an IPUConfig."""

    def __init__(self, root, path):
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_subcategories", {})

    def _child(self, leaf):
        full = _CHILDREN[self._path].get(leaf)
        if full is None:
            raise _unknown_attribute(self._path, leaf)
        return full, _METADATA[full]

    def __getattr__(self, leaf):
        if leaf.startswith("_"):
            raise AttributeError(leaf)
        full, meta = self._child(leaf)
        if meta.is_category:
            sub = self._subcategories.get(leaf)
            if sub is None:
                sub = self._subcategories[leaf] = _Category(self._root, full)
            return sub
        meta.warn_if_deprecated()
        return self._root._values[_ALIASES.get(full, full)]

    def __setattr__(self, leaf, value):
        if leaf.startswith("_"):
            raise AttributeError(f"IPUConfig: cannot set private attribute {leaf!r}")
        full, meta = self._child(leaf)
        legacy = _LEGACY_VALUES.get(full)
        if legacy is not None and isinstance(value, legacy[0]):
            warnings.warn(legacy[2], IPUConfigDeprecationWarning, stacklevel=2)
            value = legacy[1](value)
        meta.check_type(value)
        meta.warn_if_deprecated()
        self._root._values[_ALIASES.get(full, full)] = copy.deepcopy(
            normalize_value(meta.type, value)
        )

    def __dir__(self):
        return sorted(set(_CHILDREN[self._path]) | {"get_attribute_metadata"})

    def get_attribute_metadata(self, attr):
        """The AttributeMetadata of `attr`, a full name relative to this category."""
        path = self._path
        for leaf in attr.split("."):
            full = _CHILDREN.get(path, {}).get(leaf)
            if full is None:
                raise _unknown_attribute(path, leaf)
            path = full
        return _METADATA[path]

    def _lines(self, indent, only_changed):
        lines = []
        for leaf, full in _CHILDREN[self._path].items():
            meta = _METADATA[full]
            if full in _ALIASES:
                continue
            if meta.is_category:
                sub = getattr(self, leaf)._lines(indent + "  ", only_changed)
                if sub:
                    lines.append(f"{indent}{leaf}:")
                    lines.extend(sub)
                continue
            value = self._root._values[full]
            if only_changed and value == meta.default:
                continue
            lines.append(f"{indent}{leaf} = {_format_value(value)}")
        return lines

    def __repr__(self):
        body = "\n".join(self._lines("  ", False))
        return f"<IPUConfig category '{self._path}'>\n{body}"


def _format_value(value):
    if hasattr(value, "name") and type(value).__name__ in ENUMS:
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


class IPUConfig(_Category):
    """Configuration of the (simulated) IPU system, as Graphcore's IPUConfig.

    Options are attributes in nested categories (config.ipu_model.version);
    every assignment is type-checked at once and a misspelled name fails with
    the closest valid one. Pass the finished config to configure_ipu_system,
    or call its `configure_ipu_system(device="cpu")` method (registered by
    system_config.py, which builds the system from the options declared here).
    """

    def __init__(self):
        super().__init__(self, "")
        object.__setattr__(
            self, "_values", {n: _METADATA[n].default for n in OPTION_NAMES}
        )

    def to_dict(self):
        """The configuration as a flat dict {full option name: value}."""
        return copy.deepcopy(self._values)

    def from_dict(self, dct):
        """Set the options named in `dct` (flat full names or nested dicts)."""
        for full, value in _flatten(dct, ""):
            self._set_full(full, value)

    def to_json(self):
        """The configuration as a JSON string (enum values by member name)."""
        return json.dumps(
            {k: (v.name if type(v).__name__ in ENUMS else v) for k, v in self._values.items()},
            indent=2,
        )

    def from_json(self, json_cfg):
        """Set the options of a JSON string made by to_json."""
        if not isinstance(json_cfg, (str, bytes, bytearray)):
            raise TypeError(
                "IPUConfig.from_json takes a JSON string (as to_json makes); "
                f"got {type(json_cfg).__name__}. To read a file: "
                "config.from_json(open(path).read())."
            )
        try:
            dct = json.loads(json_cfg)
        except json.JSONDecodeError as e:
            text = json_cfg if isinstance(json_cfg, str) else json_cfg.decode(errors="replace")
            shown = text if len(text) <= 80 else text[:77] + "..."
            hint = ""
            if "{" not in text and "\n" not in text and len(text) < 4096:
                hint = (" It looks like a file name: pass the file's content, "
                        "config.from_json(open(path).read()).")
            raise ValueError(
                f"IPUConfig.from_json: {shown!r} is not valid JSON ({e.msg} at "
                f"line {e.lineno}, column {e.colno}). Pass the string "
                f"IPUConfig.to_json() made, e.g. '{{\"auto_select_ipus\": 1}}'.{hint}"
            ) from None
        self.from_dict(dct)

    def _set_full(self, full, value):
        path, _, leaf = full.rpartition(".")
        target = self
        for part in path.split(".") if path else ():
            target = getattr(target, part)
            if not isinstance(target, _Category):
                raise IPUConfigAttributeError(
                    f"IPUConfig: '{full}' names an option inside '{part}', which is "
                    "an option, not a category."
                )
        meta = _METADATA.get(full)
        if meta is not None and meta.type in ENUMS and isinstance(value, str):
            members = ENUMS[meta.type].__members__
            member_name = value.rpartition(".")[2]
            if member_name not in members:
                raise ValueError(
                    f"IPUConfig attribute '{full}': {value!r} is not a member of "
                    f"{meta.type} ({', '.join(members)})."
                )
            value = members[member_name]
        setattr(target, leaf, value)

    def __eq__(self, other):
        return isinstance(other, IPUConfig) and self._values == other._values

    __hash__ = None

    def __dir__(self):
        return sorted(
            set(super().__dir__())
            | {"configure_ipu_system", "to_dict", "from_dict", "to_json", "from_json"}
        )

    def __str__(self):
        return "IPUConfig:\n" + "\n".join(self._lines("  ", False))

    def __repr__(self):
        changed = self._lines("  ", True)
        if not changed:
            return "IPUConfig(<all defaults>)"
        return "IPUConfig(<changed from the defaults>\n" + "\n".join(changed) + "\n)"


def _flatten(dct, prefix):
    if not isinstance(dct, dict):
        raise TypeError(f"IPUConfig.from_dict expects a dict, got {type(dct).__name__}.")
    for key, value in dct.items():
        full = _join(prefix, key)
        meta = _METADATA.get(full)
        if meta is not None and meta.is_category and isinstance(value, dict):
            yield from _flatten(value, full)
        else:
            yield full, value


def get_attribute_metadata(attr):
    """Module-level access to the metadata of a full option/category name."""
    return IPUConfig().get_attribute_metadata(attr)

"""AttributeMetadata: what the reference documents about one IPUConfig entry,
and the type checks behind "a wrong value fails at the assignment".
"""

import copy
import numbers
import warnings

from keras_ipu.device.enums import ENUMS


class IPUConfigDeprecationWarning(FutureWarning):
    """A deprecated IPUConfig attribute was used.

    A FutureWarning (shown by default) because the reader is the script's
    author, not a library developer.
    """


def _is_int(value):
    # bool is an int to Python, never to a config option (auto_select_ipus=True
    # is a bug, not "one IPU").
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_float(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int_sequence(kind):
    def check(value):
        return isinstance(value, kind) and all(_is_int(v) for v in value)

    return check


_SIMPLE_CHECKS = {
    "bool": lambda v: isinstance(v, bool),
    "int": _is_int,
    "float": _is_float,
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, dict),
    "Union[int, List[int], Tuple[int, ...]]": lambda v: (
        _is_int(v) or _int_sequence(list)(v) or _int_sequence(tuple)(v)
    ),
}


def type_checker(type_name):
    """The predicate for a type as the reference writes it ("int", "SelectionOrder")."""
    if type_name in _SIMPLE_CHECKS:
        return _SIMPLE_CHECKS[type_name]
    if type_name in ENUMS:
        enum_cls = ENUMS[type_name]
        return lambda v: isinstance(v, enum_cls)
    raise ValueError(f"IPUConfig attribute table: unknown type {type_name!r}")


def normalize_value(type_name, value):
    """The stored form of an accepted value (plain Python, so to_dict/JSON work)."""
    if type_name == "float":
        return float(value)
    if type_name == "int":
        return int(value)
    if type_name.startswith("Union[int"):
        # Sequences are stored as lists, so a JSON round trip gives back an equal config.
        return int(value) if _is_int(value) else [int(v) for v in value]
    return value


class AttributeMetadata:
    """Metadata of one IPUConfig option or category (reference: AttributeMetadata)."""

    def __init__(self, name, doc="", type=None, default=None, deprecated_msg=None):
        self._name = name
        self._doc = doc
        self._type = type
        self._default = default
        self._deprecated_msg = deprecated_msg
        self._checker = type_checker(type) if type is not None else None
        self.__doc__ = doc

    @property
    def name(self):
        """The full name of the option/category, relative to the config root."""
        return self._name

    @property
    def type(self):
        """The type of this option, as a string; None for a category."""
        return self._type

    @property
    def default(self):
        """The default value of this option; None for a category."""
        return copy.deepcopy(self._default)

    @property
    def deprecated(self):
        return self._deprecated_msg is not None

    @property
    def deprecated_msg(self):
        """The deprecation message, or None when not deprecated."""
        return self._deprecated_msg

    @property
    def doc(self):
        return self._doc

    @property
    def is_category(self):
        return self._type is None

    def check_type(self, value):
        """True if `value` has this option's type, else TypeError naming both."""
        if self._checker is None:
            raise TypeError(
                f"'{self._name}' is a category of IPUConfig, not an option: set one of "
                f"its options instead (for example config.{self._name}.<option> = ...)."
            )
        if not self._checker(value):
            hint = ""
            if self._type in ENUMS:
                members = ", ".join(f"{self._type}.{m}" for m in ENUMS[self._type].__members__)
                hint = f" Use one of: {members}."
            raise TypeError(
                f"IPUConfig attribute '{self._name}' must be of type {self._type}, "
                f"got {value!r} of type {type(value).__name__}.{hint}"
            )
        return True

    def warn_if_deprecated(self, stacklevel=2):
        """Warn (IPUConfigDeprecationWarning) if this option/category is deprecated."""
        if self.deprecated:
            warnings.warn(
                f"IPUConfig attribute '{self._name}' is deprecated: {self._deprecated_msg}",
                IPUConfigDeprecationWarning,
                stacklevel=stacklevel + 1,
            )

    def __repr__(self):
        if self.is_category:
            return f"AttributeMetadata(name={self._name!r}, category)"
        dep = ", deprecated" if self.deprecated else ""
        return (
            f"AttributeMetadata(name={self._name!r}, type={self._type!r}, "
            f"default={self._default!r}{dep})"
        )

"""Enums of Graphcore's API that take a member or its name.

Graphcore's `GradientAccumulationReductionMethod.parse` and
`ReplicatedMetricReductionMethod.parse` accept a member or its name in any
case and refuse anything else listing the valid names; only their messages
differ. This mixin is that parse once; each enum gives its message.
"""


class ParsedByName:
    """Enum mixin: `parse(value)` takes a member or its name (any case).
    The enum gives Graphcore's message for anything else in
    `_parse_error(value, valid)` (`valid`: the members' names, comma
    separated); a method, since an enum's plain attributes are members."""

    @classmethod
    def parse(cls, value):
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.upper()
            if key in cls.__members__:
                return cls[key]
        raise ValueError(cls._parse_error(value, ", ".join(cls._member_names_)))

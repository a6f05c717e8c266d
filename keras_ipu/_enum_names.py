"""Enums of Graphcore's API that take a member or its name.

Graphcore's `GradientAccumulationReductionMethod.parse` and
`ReplicatedMetricReductionMethod.parse` accept a member or its name in any
case and refuse anything else listing the valid names; only their messages
differ. This mixin is that parse once; each enum gives its message.
"""


class ParsedByName:
    """Enum mixin: `parse(value)` takes a member or its name (any case).

    The enum gives Graphcore's message for anything else as a class
    keyword, `parse_error=` with `{value}` and `{valid}` (the members'
    names, comma separated): a keyword, since a plain attribute of an enum's
    body would be one of its members.
    """

    def __init_subclass__(cls, parse_error=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if parse_error is not None:
            cls._parse_error = parse_error

    @classmethod
    def parse(cls, value):
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.upper()
            if key in cls.__members__:
                return cls[key]
        raise ValueError(cls._parse_error.format(value=value, valid=", ".join(cls._member_names_)))

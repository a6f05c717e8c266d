"""Tables of rules keyed by name, filled by decorators.

The TensorFlow emitter (a rule per primitive) and the TensorFlow front end
(a rule per HLO opcode) each keep such a table; a name given two rules is a
mistake that would otherwise silently keep the last one.
"""


def rule_decorator(table, duplicate_message):
    """`rule(*names)`: a decorator that puts the decorated function into
    `table` under each of `names`. A name that has a rule already raises
    ValueError(duplicate_message.format(name=name))."""

    def rule(*names):
        def register(fn):
            for name in names:
                if name in table:
                    raise ValueError(duplicate_message.format(name=name))
                table[name] = fn
            return fn

        return register

    return rule

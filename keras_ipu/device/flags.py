"""TF_POPLAR_FLAGS: the environment switches of Graphcore's TensorFlow, simulated.

Read when the IPU system is configured (and when the default system is made),
so a script can set os.environ["TF_POPLAR_FLAGS"] before configuring.
"""

import dataclasses
import enum
import os
import shlex

ENV_VAR = "TF_POPLAR_FLAGS"


class SyntheticDataCategory(enum.Enum):
    """Kinds of host<->device data that --use_synthetic_data can replace."""

    Seed = "seed"
    Infeed = "infeed"
    Outfeed = "outfeed"
    HostEmbedding = "hostembedding"
    Parameters = "parameters"


_PROGRESS_BAR = ("true", "false", "auto")

# name -> (value kind, help). Kinds: "switch" (bare flag or =true/false),
# "int", "path", "categories", "progress".
KNOWN_FLAGS = {
    "use_ipu_model": ("switch", "run on the IPU Model (ipu_model.* options apply)"),
    "ipu_model_tiles": ("int", "tiles per IPU of the IPU Model (N > 0)"),
    "executable_cache_path": ("path", "directory where compiled executables are cached"),
    "use_synthetic_data": ("switch", "no host<->device data transfers: all data is synthetic"),
    "synthetic_data_categories": (
        "categories",
        "comma-separated categories made synthetic: "
        + ",".join(c.value for c in SyntheticDataCategory),
    ),
    "show_progress_bar": ("progress", "compilation progress bar: true, false or auto"),
    "log_cycle_count": ("int", "log the cycle count of each execution, measured on tile N"),
    "help": ("switch", "print the known flags"),
}


@dataclasses.dataclass(frozen=True)
class PoplarFlags:
    use_ipu_model: bool = False
    ipu_model_tiles: int = 0  # 0: the standard number for the version
    executable_cache_path: str = ""
    use_synthetic_data: bool = False
    synthetic_data_categories: frozenset = frozenset()
    show_progress_bar: str = "auto"
    log_cycle_count: int = -1  # -1: off
    help: bool = False

    def synthetic_data_for(self, category):
        """Whether data of `category` (a SyntheticDataCategory) is synthetic."""
        category = SyntheticDataCategory(category)
        return self.use_synthetic_data or category in self.synthetic_data_categories


def help_text():
    width = max(map(len, KNOWN_FLAGS)) + 2
    lines = [f"{ENV_VAR}: known flags (separate them with spaces):"]
    for name, (kind, text) in KNOWN_FLAGS.items():
        spelled = f"--{name}" if kind == "switch" else f"--{name}=..."
        lines.append(f"  {spelled:<{width + 6}} {text}")
    return "\n".join(lines)


def _flag_error(token, problem):
    return ValueError(
        f"{ENV_VAR}: {problem} in {token!r}. Known flags: "
        + ", ".join(f"--{n}" for n in KNOWN_FLAGS)
        + f". Fix or remove it in the {ENV_VAR} environment variable."
    )


def _parse_value(token, name, kind, raw):
    if kind == "switch":
        if raw is None:
            return True
        if raw.lower() in ("true", "1"):
            return True
        if raw.lower() in ("false", "0"):
            return False
        raise _flag_error(token, f"--{name} takes no value or true/false")
    if raw is None or raw == "":
        raise _flag_error(token, f"--{name} needs a value (--{name}=...)")
    if kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise _flag_error(token, f"--{name} needs an integer") from None
        if name == "ipu_model_tiles" and value <= 0:
            raise _flag_error(token, "--ipu_model_tiles needs a positive number of tiles")
        if value < 0:
            raise _flag_error(token, f"--{name} needs a non-negative integer")
        return value
    if kind == "path":
        return raw
    if kind == "progress":
        if raw.lower() not in _PROGRESS_BAR:
            raise _flag_error(token, "--show_progress_bar takes true, false or auto")
        return raw.lower()
    if kind == "categories":
        known = {c.value: c for c in SyntheticDataCategory}
        chosen = set()
        for part in filter(None, (p.strip().lower() for p in raw.split(","))):
            if part not in known:
                raise _flag_error(
                    token,
                    f"unknown synthetic data category {part!r} (known: {', '.join(known)})",
                )
            chosen.add(known[part])
        return frozenset(chosen)
    raise AssertionError(kind)


def parse_flags(text):
    """PoplarFlags from a TF_POPLAR_FLAGS string; ValueError for an unknown flag."""
    values = {}
    try:
        tokens = shlex.split(text or "")
    except ValueError as e:  # shlex: "No closing quotation" / "No escaped character"
        raise ValueError(
            f"{ENV_VAR}={text!r} cannot be read: {str(e).lower()} (a quote "
            "opened and never closed, or a trailing backslash). Flags are "
            "split like shell words: close the quote (--executable_cache_path="
            "'/path with spaces') or remove it, in the environment variable "
            f"{ENV_VAR}."
        ) from None
    for token in tokens:
        if not token.startswith("--"):
            raise _flag_error(token, "a flag must start with '--'")
        name, eq, raw = token[2:].partition("=")
        if name not in KNOWN_FLAGS:
            raise _flag_error(token, f"unknown flag --{name}")
        values[name] = _parse_value(token, name, KNOWN_FLAGS[name][0], raw if eq else None)
    return PoplarFlags(**values)


def read_flags(environ=None, print_help=True):
    """The flags of the environment; --help prints the known flags once read."""
    environ = os.environ if environ is None else environ
    flags = parse_flags(environ.get(ENV_VAR, ""))
    if flags.help and print_help:
        print(help_text())
    return flags


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_switch(name, default=True, environ=None):
    """An on/off environment variable of keras_ipu (KERAS_IPU_NATIVE,
    KERAS_IPU_HOST_MALLOC): 1/true/yes/on or 0/false/no/off in any case;
    unset or empty means `default`. Anything else is an error naming the
    variable, the value and the fix (a misspelt "off" must not be on)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(
        f"{name}={raw!r} is neither on nor off. Set it to 0 (or false, no, "
        f"off) to turn it off, 1 (or true, yes, on) to turn it on, or unset "
        "it for the default."
    )


"""Config files and --key=value overrides, checked against the defaults of train.py.

    python train.py config/train_shakespeare.py --batch_size=32 --compile=False

A config file is plain Python whose top-level assignments override defaults. A `--key=value` is
parsed as a Python literal (a bare word stays a string). Every key must exist in the defaults and
every value must have the default's type (an int is accepted where a float is expected); nothing is
clamped or coerced silently. Later arguments win over earlier ones.
"""
import ast
import difflib
import os
import sys
import traceback
import types


class ConfigError(ValueError):
    pass


def run_script(main, *user_errors):
    """main(sys.argv[1:]) for a script's __main__: a ConfigError or one of `user_errors` (a mistake
    in the input or a fault outside the program, not a bug) ends the process with its one-line
    message instead of a traceback, and with the error's exit_code where it has one (else 1)."""
    try:
        main(sys.argv[1:])
    except (ConfigError, *user_errors) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 1))


def apply_config(defaults, argv):
    """Return a new dict: `defaults` updated by the config files and overrides in `argv`."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"override {arg!r} needs a value: write --{key}=VALUE")
            set_key(config, defaults, key, parse_value(raw), source=arg)
        else:
            for key, value in read_config_file(arg).items():
                set_key(config, defaults, key, value, source=arg)
    return config


def read_config_file(path):
    # __file__ lets a config build on another one next to it:
    #   exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())
    namespace = {"__file__": os.path.abspath(path)}
    try:
        with open(path) as f:
            code = compile(f.read(), path, "exec")
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found (arguments are config files or --key=value)")
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error ({e.msg}): fix the config file") from None
    try:
        exec(code, namespace)
    except Exception as e:  # the config's own code failed: point at its line, not at this module
        line = [frame.lineno for frame in traceback.extract_tb(e.__traceback__) if frame.filename == path]
        where = f"{path}:{line[-1]}" if line else path
        raise ConfigError(f"{where}: {type(e).__name__}: {e}: fix the config file") from None
    # Imports and helpers are not config keys: modules, and anything callable (Python or builtin
    # functions such as `from math import sqrt`, classes). No config value is callable.
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType) and not callable(v)}


def parse_value(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word such as --dataset=shakespeare


def set_key(config, defaults, key, value, source):
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults.keys(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see the defaults at the top of train.py"
        raise ConfigError(f"unknown config key {key!r} (from {source}){hint}")
    default = defaults[key]
    config[key] = check_type(key, value, default, source)


def check_type(key, value, default, source):
    expected = type(default)
    if expected is float and type(value) is int:
        return float(value)  # exact: 3 means 3.0, nothing is lost
    if expected in (list, tuple) and isinstance(value, (list, tuple)):
        return expected(value)
    if type(value) is not expected:
        raise ConfigError(f"config key {key!r} (from {source}) expects {expected.__name__} like the "
                          f"default {default!r}, got {type(value).__name__} {value!r}")
    return value

"""Config files and --key=value overrides, checked against a script's DEFAULTS.

    python train.py config/train_shakespeare.py --batch_size=32 --compile=False
    python train.py --help      # every key, its default and its meaning

A config file is plain Python whose top-level assignments override defaults. A `--key=value` is
parsed as a Python literal (a bare word stays a string); a bare `--key` whose default is a bool means
`--key=True`. Every key must exist in the defaults and every value must have the default's type (an
int is accepted where a float is expected); nothing is clamped or coerced silently. Later arguments win over earlier ones. `--help` (or `-h`) prints the
script's usage and its keys, each with its default and the comment written beside it.
"""
import ast
import difflib
import io
import os
import sys
import tokenize
import traceback
import types

HELP_FLAGS = ("--help", "-h")


class ConfigError(ValueError):
    pass


class HelpRequested(Exception):
    """--help among the arguments: run_script answers it with help_text(doc, *documented), the
    script's keys as one or more module-level dicts (a tool's own OPTIONS and the keys it shares)."""

    def __init__(self, *documented):
        super().__init__("--help")
        self.documented = documented


def run_script(main, *user_errors):
    """main(sys.argv[1:]) for a script's __main__: a ConfigError or one of `user_errors` (a mistake
    in the input or a fault outside the program, not a bug) ends the process with its one-line
    message instead of a traceback, and with the error's exit_code where it has one (else 1);
    --help prints the script's docstring and keys and exits 0. An int that main returns is the exit
    status (a check script's 1 when a check failed); any other result means 0. Under torchrun every
    rank checks the same config, so a ConfigError is printed by each node's first rank only (once
    per node)."""
    try:
        status = main(sys.argv[1:])
    except HelpRequested as request:
        try:
            print(help_text(sys.modules[main.__module__].__doc__, *request.documented), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush cannot fail again
        sys.exit(0)
    except (ConfigError, *user_errors) as e:
        if not isinstance(e, ConfigError) or int(os.environ.get("LOCAL_RANK", 0)) == 0:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 1))
    sys.exit(status if type(status) is int else 0)


def apply_config(defaults, argv):
    """Return a new dict: `defaults` updated by the config files and overrides in `argv`."""
    if any(arg in HELP_FLAGS for arg in argv):
        raise HelpRequested(defaults)
    config = dict(defaults)
    for arg in argv:
        key, raw = split_arg(arg, defaults)
        if key is not None:
            set_key(config, defaults, key, parse_value(raw), source=arg)
        else:
            for key, value in read_config_file(arg).items():
                set_key(config, defaults, key, value, source=arg)
    return config


def options_and_paths(argv, *documented, text_keys=()):
    """A tool's (options, positional arguments): --key=value checked against the defaults, one or
    more module-level dicts (a tool's own OPTIONS, then keys it shares with other tools; a key
    belongs to one of them) that --help lists in that order; the text_keys kept as written ('1,2'
    stays a string); every other argument a path."""
    if any(arg in HELP_FLAGS for arg in argv):
        raise HelpRequested(*documented)
    defaults = merged(documented)
    options, paths = dict(defaults), []
    for arg in argv:
        key, raw = split_arg(arg, defaults)
        if key is None:
            paths.append(arg)
        elif key in text_keys and key in defaults:
            options[key] = raw
        else:
            set_key(options, defaults, key, parse_value(raw), source=arg)
    return options, paths


def merged(documented):
    """One dict of the keys of several; a key in two of them is a mistake in the script."""
    defaults = {}
    for keys in documented:
        twice = sorted(set(defaults) & set(keys))
        if twice:
            raise ValueError(f"{twice} defined twice: a key belongs to one dict of defaults")
        defaults.update(keys)
    return defaults


def split_arg(arg, defaults):
    """(key, raw value) of a --key=value argument, (None, arg) of any other (a file or a directory);
    a bare --key whose default is a bool means --key=True. The one reading of the command line that
    train.py, sweep.py and report.py share."""
    if not arg.startswith("--"):
        return None, arg
    key, sep, raw = arg[2:].partition("=")
    if not sep and isinstance(defaults.get(key), bool):
        return key, "True"
    if not sep:
        raise ConfigError(f"override {arg!r} needs a value: write --{key}=VALUE")
    return key, raw


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
        hint = f"; did you mean {', '.join(close)}?" if close else "; --help lists every key"
        raise ConfigError(f"unknown config key {key!r} (from {source}){hint}")
    default = defaults[key]
    config[key] = check_type(key, value, default, source)


def check_type(key, value, default, source):
    if default is None:  # settled at start-up from other keys (runtime.settle), which checks the value
        return value
    expected = type(default)
    if expected is float and type(value) is int:
        return float(value)  # exact: 3 means 3.0, nothing is lost
    if expected in (list, tuple) and isinstance(value, (list, tuple)):
        return expected(value)
    if type(value) is not expected:
        raise ConfigError(f"config key {key!r} (from {source}) expects {expected.__name__} like the "
                          f"default {default!r}, got {type(value).__name__} {value!r}")
    return value


# ----------------------------------------------------------------------------- --help

def help_text(doc, *documented):
    """The script's docstring, then one line per key: `--key=default  meaning`, the meaning being
    the comment beside the key where its dict is written (comment lines between keys are headings);
    the keys of several dicts (a tool's own, then those it shares) one dict after the other."""
    defaults = merged(documented)
    if not defaults:  # a tool of paths only
        return (doc or "").strip()
    lines = [(doc or "").strip(), "", "keys (--key=default, then its meaning):"]
    width = max(len(f"--{k}={v!r}") for k, v in defaults.items())
    for keys in documented:
        for key, comment in documented_keys(keys):
            if key is None:
                lines.append(f"  # {comment}")
            else:
                lines.append(f"  {f'--{key}={defaults[key]!r}':<{width}}  {comment}".rstrip())
    return "\n".join(lines)


def documented_keys(defaults):
    """[(key, comment)] in the order the keys are written, with (None, heading) for comment lines of
    their own, read from the source of the module that assigns `defaults` as `NAME = dict(...)`."""
    for module in list(sys.modules.values()):
        source = definition_source(module, defaults)
        if source is None:
            continue
        text, first, last = source
        comments = {}  # line number -> comment text
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and first <= tok.start[0] <= last:
                comments[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.line.lstrip().startswith("#"))
        call = next(node for node in ast.walk(ast.parse(text))
                    if isinstance(node, ast.Call) and node.lineno == first and getattr(node.func, "id", "") == "dict")
        out, ends = [], {kw.arg: kw.value.end_lineno for kw in call.keywords}
        for line, (comment, alone) in sorted(comments.items()):
            if alone:
                out.append((line, None, comment))
        for key, line in ends.items():
            comment = comments.get(line, ("", True))
            out.append((line, key, "" if comment[1] else comment[0]))
        return [(key, comment) for _, key, comment in sorted(out, key=lambda t: (t[0], t[1] is not None))]
    return [(key, "") for key in defaults]


def definition_source(module, defaults):
    """(source, first line, last line) of `NAME = dict(...)` in module when NAME is `defaults`."""
    names = [name for name, value in list(vars(module).items()) if value is defaults]
    path = getattr(module, "__file__", None)
    if not names or not path or not path.endswith(".py"):
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for node in ast.parse(text).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and any(getattr(t, "id", None) in names for t in node.targets)):
            return text, node.value.lineno, node.value.end_lineno
    return None

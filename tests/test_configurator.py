"""configurator.apply_config: config files, --key=value literals, type checks and helpful errors."""
import pytest

import configurator
from configurator import ConfigError, apply_config

DEFAULTS = dict(
    batch_size=12,
    learning_rate=6e-4,
    compile=False,
    dataset="shakespeare",
    log_act_norm_layers=[0, -1],
    out_dir="out",
)


# keys that several tools share, documented once (as tools/benchrows.py's SHARED)
SHARED = dict(
    device="",  # '' picks cuda when available
    # what comes out
    json="",  # also write the results to this file
)


def write_config(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_no_arguments_returns_a_copy_of_the_defaults():
    config = apply_config(DEFAULTS, [])
    assert config == DEFAULTS
    config["batch_size"] = 99
    assert DEFAULTS["batch_size"] == 12  # the defaults are never mutated


def test_config_file_overrides_and_ignores_imports(tmp_path):
    # Imports of every kind bind modules, Python functions, builtins (math.sqrt) and classes;
    # none of them is a config key.
    path = write_config(tmp_path, (
        "import math\n"
        "import os.path\n"
        "from os import path\n"
        "from math import sqrt\n"
        "from collections import OrderedDict\n"
        "def helper(x):\n"
        "    return 2 * x\n"
        "_private = 123\n"
        "batch_size = int(sqrt(16)) * helper(2)\n"
        "dataset = 'openwebtext'\n"
        "learning_rate = 1e-3\n"
    ))
    config = apply_config(DEFAULTS, [path])
    assert config == {**DEFAULTS, "batch_size": 16, "dataset": "openwebtext", "learning_rate": 1e-3}


@pytest.mark.parametrize("arg, key, value", [
    ("--batch_size=32", "batch_size", 32),
    ("--learning_rate=1e-3", "learning_rate", 1e-3),
    ("--compile=True", "compile", True),
    ("--log_act_norm_layers=[1, 2, -1]", "log_act_norm_layers", [1, 2, -1]),
    ("--dataset=openwebtext", "dataset", "openwebtext"),  # a bare word stays a string
    ("--dataset='openwebtext'", "dataset", "openwebtext"),
    ('--dataset="123"', "dataset", "123"),  # quoted: a string even though it looks like an int
    ("--out_dir=out-shakespeare", "out_dir", "out-shakespeare"),  # not a literal (a - b): a string
    ("--out_dir=/tmp/run/1", "out_dir", "/tmp/run/1"),
])
def test_override_literals(arg, key, value):
    config = apply_config(DEFAULTS, [arg])
    assert config[key] == value and type(config[key]) is type(value)
    assert {k: v for k, v in config.items() if k != key} == {k: v for k, v in DEFAULTS.items() if k != key}


def test_int_is_accepted_for_a_float_default():
    config = apply_config(DEFAULTS, ["--learning_rate=1"])
    assert config["learning_rate"] == 1.0 and type(config["learning_rate"]) is float


@pytest.mark.parametrize("arg, key, expected", [
    ("--batch_size=1.5", "batch_size", "int"),
    ("--batch_size=True", "batch_size", "int"),  # bool is an int subclass, but not an int here
    ("--compile=1", "compile", "bool"),
    ("--learning_rate=fast", "learning_rate", "float"),
    ("--dataset=3", "dataset", "str"),
    ("--log_act_norm_layers=0", "log_act_norm_layers", "list"),
])
def test_type_mismatch_names_key_and_expected_type(arg, key, expected):
    with pytest.raises(ConfigError) as info:
        apply_config(DEFAULTS, [arg])
    message = str(info.value)
    assert repr(key) in message and f"expects {expected}" in message


def test_type_mismatch_in_config_file(tmp_path):
    path = write_config(tmp_path, "batch_size = 1.5\n")
    with pytest.raises(ConfigError, match=r"'batch_size'.*expects int"):
        apply_config(DEFAULTS, [path])


def test_unknown_key_suggests_close_matches():
    with pytest.raises(ConfigError) as info:
        apply_config(DEFAULTS, ["--learning_rat=1e-3"])
    message = str(info.value)
    assert "'learning_rat'" in message and "did you mean learning_rate" in message


def test_unknown_key_without_close_match_points_to_help():
    with pytest.raises(ConfigError, match="unknown config key 'zzz'.*--help lists every key"):
        apply_config(DEFAULTS, ["--zzz=1"])


def test_unknown_key_in_config_file(tmp_path):
    path = write_config(tmp_path, "batch_sise = 4\n")
    with pytest.raises(ConfigError) as info:
        apply_config(DEFAULTS, [path])
    message = str(info.value)
    assert "'batch_sise'" in message and path in message and "batch_size" in message


def test_missing_config_file(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match="not found"):
        apply_config(DEFAULTS, [missing])


def test_a_bare_boolean_flag_means_true_and_any_other_bare_key_needs_a_value():
    assert apply_config(DEFAULTS, ["--compile"])["compile"] is True
    assert apply_config(DEFAULTS, ["--compile", "--compile=False"])["compile"] is False  # later wins
    with pytest.raises(ConfigError, match=r"override '--batch_size' needs a value: write --batch_size=VALUE"):
        apply_config(DEFAULTS, ["--batch_size"])


def test_later_arguments_win(tmp_path):
    path = write_config(tmp_path, "batch_size = 4\ndataset = 'owt'\n")
    assert apply_config(DEFAULTS, ["--batch_size=2", "--batch_size=3"])["batch_size"] == 3
    config = apply_config(DEFAULTS, [path, "--batch_size=8"])
    assert config["batch_size"] == 8 and config["dataset"] == "owt"
    config = apply_config(DEFAULTS, ["--batch_size=8", path])
    assert config["batch_size"] == 4


def test_scripts_report_input_mistakes_in_one_line_and_let_bugs_raise(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["script.py", "--x=1"])
    seen = []

    def mistaken(argv):
        seen.append(argv)
        raise FileNotFoundError("data/x/train.bin is missing: run python data/x/prepare.py")

    with pytest.raises(SystemExit) as exit_info:
        configurator.run_script(mistaken, FileNotFoundError)
    assert exit_info.value.code == 1 and seen == [["--x=1"]]
    assert capsys.readouterr().err == "error: data/x/train.bin is missing: run python data/x/prepare.py\n"
    with pytest.raises(KeyError):  # not a listed user error: the traceback stays
        configurator.run_script(lambda argv: {}["bug"], FileNotFoundError)


def test_a_tool_reads_its_own_keys_and_shared_ones_and_lists_both_in_help(capsys, monkeypatch):
    options, paths = configurator.options_and_paths(["--batch_size=3", "--json=out.json", "run1", "--device=cpu"],
                                                    DEFAULTS, SHARED, text_keys=("device",))
    assert options == {**DEFAULTS, **SHARED, "batch_size": 3, "json": "out.json", "device": "cpu"}
    assert paths == ["run1"]
    with pytest.raises(ConfigError, match="unknown config key 'jsn'.*did you mean json"):
        configurator.options_and_paths(["--jsn=x"], DEFAULTS, SHARED)
    with pytest.raises(ValueError, match=r"\['json'\] defined twice"):  # a key belongs to one dict
        configurator.options_and_paths([], SHARED, dict(json="x"))

    def tool(argv):
        configurator.options_and_paths(argv, DEFAULTS, SHARED)

    monkeypatch.setattr("sys.argv", ["tool.py", "--batch_size=3", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        configurator.run_script(tool)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(__doc__.strip()) and out.index("--batch_size=12") < out.index("--out_dir='out'")
    assert out.index("--out_dir='out'") < out.index("--device=''") < out.index("# what comes out") < out.index("--json")
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  --")}
    column = len("  --log_act_norm_layers=[0, -1]  ")  # the longest key of either dict sets the meanings' column
    assert lines["--device=''"][column:] == "'' picks cuda when available"


@pytest.mark.parametrize("result, status", [(0, 0), (1, 1), (None, 0), ({"loss": 1.0}, 0), (True, 0)])
def test_an_int_that_main_returns_is_the_exit_status(result, status, monkeypatch):
    monkeypatch.setattr("sys.argv", ["check.py"])
    with pytest.raises(SystemExit) as exit_info:
        configurator.run_script(lambda argv: result)
    assert exit_info.value.code == status

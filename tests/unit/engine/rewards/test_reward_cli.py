import json
import subprocess
import sys

import pytest

from relax.entrypoints.reward import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr()


def test_prints_the_math_result_as_json(capsys):
    code, out = run_cli(capsys, "--rm-type", "math", "--response", r"so \boxed{\frac{1}{2}}", "--label", "0.5")
    assert code == 0 and json.loads(out.out) == 1.0


def test_dict_results_and_json_labels(capsys):
    _, out = run_cli(capsys, "--rm-type", "dapo", "--response", "Answer: 41", "--label", "42")
    assert json.loads(out.out) == {"score": -1.0, "acc": False, "pred": "41"}
    _, out = run_cli(capsys, "--rm-type", "f1", "--response", "paris", "--label-json", '["London", "Paris"]')
    assert json.loads(out.out) == 1.0


def test_metadata_json_is_passed_to_the_reward(capsys):
    metadata = json.dumps({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [None]})
    _, out = run_cli(capsys, "--rm-type", "ifbench", "--response", "a, b", "--label", "", "--metadata", metadata)
    assert json.loads(out.out) == 0.0


def test_unknown_type_exits_2_with_the_known_types(capsys):
    code, out = run_cli(capsys, "--rm-type", "nope", "--response", "x", "--label", "y")
    assert code == 2 and "known types" in out.err


def test_bad_metadata_json_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--rm-type", "f1", "--response", "x", "--label", "y", "--metadata", "{oops"])
    assert exc.value.code == 2 and "--metadata is not valid JSON" in capsys.readouterr().err


def test_cli_does_not_import_torch_or_ray():
    code = ("import sys; from relax.entrypoints.reward import main; "
            "main(['--rm-type', 'math', '--response', r'\\boxed{1}', '--label', '1']); "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'heavy import'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0"

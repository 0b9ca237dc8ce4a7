"""The in-process benchmark (tests/benchmarks/inprocess.py) measures both checkouts it is
given, each in a process of its own that imports that checkout's proxy."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.benchmarks import inprocess


def test_it_measures_this_checkout_and_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--requests", "20", "--warm", "10", "--repeats", "1", "--baseline", str(inprocess.ROOT)]
    assert inprocess.main(args) == 0
    printed = capsys.readouterr().out
    medians = re.findall(r"^(baseline|proxy): median (\d+)", printed, re.MULTILINE)
    assert [name for name, _ in medians] == ["baseline", "proxy"]
    assert all(int(value) > 0 for _, value in medians)
    assert re.search(r"^proxy / baseline: \d+\.\d\dx$", printed, re.MULTILINE)


def test_a_checkout_that_cannot_serve_fails_the_run(tmp_path) -> None:
    """A baseline whose proxy does not import is an error, not a figure."""
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "__init__.py").write_text("raise ImportError('broken checkout')\n")
    args = ["--requests", "5", "--warm", "0", "--repeats", "1", "--baseline", str(tmp_path)]
    with pytest.raises(RuntimeError, match="broken checkout"):
        inprocess.main(args)


def test_a_setting_reaches_the_measured_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    """``--set`` changes the settings of the app each measuring process builds: a valid
    one is measured and named, one the proxy refuses fails the run with its reason."""
    args = ["--requests", "10", "--warm", "5", "--repeats", "1", "--set", "sessions=false"]
    assert inprocess.main(args) == 0
    printed = capsys.readouterr().out
    assert "one at a time, with sessions=false" in printed
    assert re.search(r"^proxy: median \d+", printed, re.MULTILINE)
    with pytest.raises(RuntimeError, match="session_store must be memory or redis"):
        inprocess.main([*args[:6], "--set", "session_store=nowhere"])


def test_a_setting_without_a_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        inprocess.parse_args(["--set", "sessions"])
    assert "--set and --versus take SETTING=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        inprocess.parse_args(["--versus", "=false"])


def test_a_versus_setting_is_measured_beside_the_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    """``--versus`` measures a second app in each measuring process, with the setting too:
    both figures and their paired ratio are printed, and a setting the proxy refuses fails
    the run with its reason (it reached the second app's settings)."""
    args = ["--requests", "10", "--warm", "5", "--repeats", "2", "--versus", "sessions=false"]
    assert inprocess.main(args) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^proxy: median \d+ \(\d+, \d+\)$", printed, re.MULTILINE)
    assert re.search(r"^proxy versus sessions=false: median \d+ \(\d+, \d+\)$", printed, re.M)
    ratio = r"^proxy versus sessions=false / proxy: median \d\.\d{3}x \(\d\.\d{3}, \d\.\d{3}\)$"
    assert re.search(ratio, printed, re.MULTILINE)
    with pytest.raises(RuntimeError, match="session_store must be memory or redis"):
        inprocess.main([*args[:6], "--versus", "session_store=nowhere"])


def test_paired_measures_both_checkouts_in_one_process(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--paired``: the baseline's app and this checkout's in one process, each made of its
    own checkout's modules. The baseline here is a copy of this proxy whose ``create_app``
    refuses a second app: made of its modules twice, the run fails."""
    shutil.copytree(inprocess.ROOT / "proxy", tmp_path / "proxy")
    with (tmp_path / "proxy" / "app.py").open("a") as app:
        app.write(
            "\n_made = []\n_create_app = create_app\n\n\n"
            "def create_app(*args, **kwargs):\n"
            "    if _made:\n"
            "        raise RuntimeError('made of the baseline twice')\n"
            "    _made.append(True)\n"
            "    return _create_app(*args, **kwargs)\n"
        )
    args = ["--requests", "10", "--warm", "5", "--repeats", "2", "--baseline", str(tmp_path)]
    assert inprocess.main([*args, "--paired"]) == 0
    printed = capsys.readouterr().out
    medians = re.findall(r"^(baseline|proxy|collector, both): median \d+", printed, re.M)
    assert medians == ["baseline", "proxy", "collector, both"]
    ratio = r"^proxy / baseline, paired: median \d\.\d{3}x \(\d\.\d{3}, \d\.\d{3}\)$"
    assert re.search(ratio, printed, re.MULTILINE)


def test_paired_needs_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        inprocess.parse_args(["--paired"])
    assert "--paired takes --baseline" in capsys.readouterr().err

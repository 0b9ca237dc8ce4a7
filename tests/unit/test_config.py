from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from proxy import config
from proxy.cli import build_parser
from proxy.config import Settings, SettingsError


def test_defaults() -> None:
    settings = config.load(environ={})
    assert settings == Settings()
    assert settings.upstream_base == "http://127.0.0.1:8000"


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "proxy.yaml"
    file.write_text("upstream: http://file:1\nport: 1111\nread_timeout: 5\n")
    environ = {"PREFILL_PROXY_PORT": "2222", "PREFILL_PROXY_CONFIG": str(file)}
    settings = config.load({"read_timeout": "7.5"}, environ=environ)
    assert settings.upstream == "http://file:1"  # file
    assert settings.port == 2222  # env beats file
    assert settings.read_timeout == 7.5  # command line beats both


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("rewrite", "off", False),
        ("rewrite", "TRUE", True),
        ("log_bodies", "1", True),
        ("max_connections", "300", 300),
        ("total_timeout", "0", 0.0),
        ("disabled_rewrites", "a, b,,c", ("a", "b", "c")),
    ],
)
def test_environment_values_are_typed(name: str, raw: str, expected: object) -> None:
    settings = config.load(environ={config.env_name(name): raw})
    assert getattr(settings, name) == expected


def test_yaml_list_for_tuple_setting(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("disabled_rewrites: [x, y]\n")
    assert config.load(environ={}, config_file=str(file)).disabled_rewrites == ("x", "y")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PREFILL_PROXY_PORT": "eighty"}, "port"),
        ({"PREFILL_PROXY_REWRITE": "maybe"}, "boolean"),
        ({"PREFILL_PROXY_UPSTREAM": "localhost:8000"}, r"http\(s\) URL"),
        ({"PREFILL_PROXY_MAX_BODY_BYTES": "0"}, "positive"),
        ({"PREFILL_PROXY_TOTAL_TIMEOUT": "-1"}, ">= 0"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(environ: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        config.load(environ=environ)


def test_unknown_key_in_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("upstreams: http://x\n")
    with pytest.raises(SettingsError, match=r"unknown settings.*upstreams"):
        config.load(environ={}, config_file=str(file))


def test_every_setting_has_a_flag_with_its_env_name_in_help() -> None:
    parser = build_parser()
    serve = next(
        action.choices["serve"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    help_text = serve.format_help()
    for field in config.fields():
        assert "--" + field.name.replace("_", "-") in help_text
        assert config.env_name(field.name) in " ".join(help_text.split())


def test_command_line_parsing_round_trip() -> None:
    args = build_parser().parse_args(["serve", "--upstream", "http://u:9", "--port", "9000"])
    settings = config.from_arguments(args, environ={})
    assert (settings.upstream, settings.port) == ("http://u:9", 9000)


def test_readme_configuration_table_lists_every_setting() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name, env, _default, _help in config.reference_rows():
        assert f"`{env}`" in readme, textwrap.shorten(f"README lacks {name}", 80)


def test_readme_metrics_table_lists_every_metric() -> None:
    from prometheus_client import CollectorRegistry

    from proxy.metrics import Metrics

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    metrics = Metrics(CollectorRegistry())
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in readme, f"README's metrics table lacks {name}"

"""The ``prefill-proxy`` command: ``serve`` runs the proxy; ``sim``, ``replay``, ``demo``."""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from proxy import __version__, config, heap


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app
    from proxy.server import Limits, protocol

    settings = config.from_arguments(args)
    setup_logging(settings.log_level)
    logging.getLogger("prefill_proxy").info(
        "prefill-proxy %s on http://%s:%d -> %s",
        __version__,
        settings.host,
        settings.port,
        settings.upstream_base,
    )
    heap.reuse_freed_pages()
    app = create_app(settings)
    heap.settle()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=protocol(Limits.from_settings(settings)),
        log_level=settings.log_level,
        access_log=False,  # the proxy writes its own line per request, with tokens and timing
        server_header=False,  # the upstream's Server and Date headers pass through instead
        date_header=False,
        # Nothing here reads the client's address or scheme, which uvicorn would otherwise
        # take from X-Forwarded-* on every request (those headers go upstream as sent).
        proxy_headers=False,
        timeout_keep_alive=65,  # outlive clients' idle keep-alive, so they close first
        timeout_graceful_shutdown=settings.shutdown_grace,
    )
    return 0


def setup_logging(level: str) -> None:
    """Diagnostics on stderr; the access log on stdout, one bare JSON object a line, so a
    log collector (a container's stdout) parses it without a prefix."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    access = logging.getLogger("prefill_proxy.access")
    if access.handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefill-proxy",
        description="OpenAI-compatible proxy that makes vLLM's prefix cache hit for agents.",
    )
    parser.add_argument("--version", action="version", version=f"prefill-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Each option can also be set by the environment variable "
        "shown, or in the YAML file given by --config; the command line wins, then the "
        "environment, then the file.",
    )
    config.add_arguments(serve)
    serve.set_defaults(run=_serve)
    for name, module, summary in _TOOLS:
        tool = commands.add_parser(name, help=summary, description=summary)
        try:
            _tool_module(module).configure(tool)
        except ModuleNotFoundError:  # an installation of serve alone (the container image)
            tool.set_defaults(run=functools.partial(_not_installed, name))
            continue
        tool.set_defaults(run=lambda args, module=module: _tool_module(module).run(args))
    return parser


def _not_installed(name: str, args: argparse.Namespace) -> int:
    print(f"prefill-proxy {name} is not part of this installation (serve only)", file=sys.stderr)
    return 2


# Subcommands beyond serve: each module has configure(parser) and run(args) -> exit code.
_TOOLS = (
    ("sim", "proxy.sim.command", "run a vLLM-like simulator (prefix cache + timing model)"),
    ("replay", "proxy.replay.command", "replay agent traces against a server and measure"),
    ("demo", "proxy.demo", "simulator + proxy + synthetic agents: direct vs proxied, no GPU"),
)


def _tool_module(name: str) -> Any:
    return importlib.import_module(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except config.SettingsError as error:
        parser.exit(2, f"prefill-proxy: {error}\n")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

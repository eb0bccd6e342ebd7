"""The df-db application: global options, command groups, errors and exit statuses.

Exit statuses: 0 done; 1 the command failed (a missing table or key, bad JSON,
an unreachable backend, a refused confirmation), with one line on stderr and no
traceback; 2 a usage error or a bad configuration.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

try:  # typer 0.2x vendors click
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover - typer on the click package
    from click import exceptions as click  # type: ignore[no-redef]

from dfpubsub import __version__
from dfpubsub.backends import foreign
from dfpubsub.console import console_main, one_line

from . import admin_cmds, controller_cmds, doctor_cmds, notify_cmds, pubsub_cmds, queue_cmds, store_cmds, watch
from .context import CliState, Format

__all__ = ["app", "main"]

app = typer.Typer(
    name="df-db",
    help="Inspect and administer the dfpubsub northbound store, pub/sub and notification queues.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
app.add_typer(store_cmds.app)
app.add_typer(pubsub_cmds.app)
app.add_typer(watch.app)
app.add_typer(queue_cmds.app, name="queues", help="The persistent notification queues (shards of persistent topics).")
app.add_typer(notify_cmds.app)
app.add_typer(doctor_cmds.app)
app.add_typer(controller_cmds.app)
app.add_typer(admin_cmds.topic_app, name="topic")
app.add_typer(admin_cmds.config_app, name="notification")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"df-db {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option(
        "--config", metavar="FILE", help="TOML config file, as the daemons read it (default: $DFPUBSUB_CONFIG).")
    ] = None,
    store: Annotated[str | None, typer.Option(
        "--store", metavar="URL", help="Store URL; overrides store.url (sqlite:///path, etcd://h:p, redis://h:p/db, "
                                    "redis+sentinel://h:p[,h:p]/master/db).")
    ] = None,
    queues: Annotated[str | None, typer.Option(
        "--queues", metavar="URL", help="Notification queues URL (default: the store's URL).")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-o", help="table for people, json or yaml for scripts.")] = Format.table,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version, help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = CliState(config, store, queues, fmt)
    # Every record a read of this command skips is shown with its result (output.Output.footer),
    # not also as a log line on stderr.
    ctx.obj.out.skipped = ctx.with_resource(foreign.collect())
    foreign.log.addHandler(logging.NullHandler())


#: The global options that take a value, in every spelling; kubectl-style, they may follow the command.
_GLOBAL_WITH_VALUE = {"--config", "--store", "--queues", "--format", "-o"}


def hoist_global_options(args: list[str]) -> list[str]:
    """``args`` with the global options moved before the command (``df-db tables -o json`` reads
    as ``df-db -o json tables``). No command has options of these names, so none is taken from
    a command; everything after ``--`` stays where it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name = arg.split("=", 1)[0]
        if name in _GLOBAL_WITH_VALUE:
            takes_next = "=" not in arg and i + 1 < len(args)
            front.extend(args[i:i + 2] if takes_next else [arg])
            i += 2 if takes_next else 1
            continue
        if len(arg) > 2 and arg.startswith("-o") and not arg.startswith("--"):  # -ojson
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


@console_main("df-db")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-db``: the exit status; errors are one line (dfpubsub.console)."""
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    try:
        status = app(args=args, prog_name="df-db", standalone_mode=False)
    except click.UsageError as exc:
        if not args:
            return 2  # click printed the help
        print(f"df-db: error: {one_line(exc.format_message())} (see df-db --help)", file=sys.stderr)
        return 2
    except click.ClickException as exc:
        print(f"df-db: {one_line(exc.format_message())}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        print("df-db: aborted; nothing was changed", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (df-db dump | head): not an error of ours, and no traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())

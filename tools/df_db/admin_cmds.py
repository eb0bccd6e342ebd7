"""``topic create|set|rm`` and ``notification put|rm``: administer notification topics and
configurations, as radosgw-admin does for Ceph's (JSON in, the stored record out)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dfpubsub.errors import NotFound, TopicNotFound
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic

from .context import CliState, confirm, public_url, state
from .items import read_input

__all__ = ["topic_app", "config_app"]

topic_app = typer.Typer(no_args_is_help=True, help="Create, change and delete notification topics.")
config_app = typer.Typer(no_args_is_help=True,
                         help="Bind sources to topics (notification configurations), or unbind them.")

Data = Annotated[str | None, typer.Argument(metavar="[JSON]", help="The record as JSON (or --file).")]
File = Annotated[str | None, typer.Option("--file", "-f", metavar="PATH", help="Read the JSON from PATH (-: stdin).")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _json(data: str | None, path: str | None) -> bytes:
    if (data is None) == (path is None):
        raise typer.BadParameter("give the JSON either as an argument or with --file PATH, exactly one of them")
    return read_input(data, path)[0].encode()


def _registry(st: CliState) -> NotificationRegistry:
    return NotificationRegistry(st.open_queues(create=True), st.settings.notify.default_shards)


def _show_topic(st: CliState, topic: Topic) -> None:
    st.out.record({**json.loads(topic.to_json()), "endpoint": public_url(topic.endpoint)})


@topic_app.command("create")
def topic_create(ctx: typer.Context, data: Data = None, file: File = None) -> None:
    """Create a topic from JSON: {"name", "endpoint", "persistent"?, "shards"?, "time_to_live"?, ...}
    (the fields of `df-db notifications -o json`); creating it again unchanged is no error."""
    st = state(ctx)
    topic = Topic.from_json(_json(data, file))
    registry = _registry(st)
    with registry.queues:
        _show_topic(st, registry.create_topic(topic))


@topic_app.command("set")
def topic_set(ctx: typer.Context, data: Data = None, file: File = None) -> None:
    """Change an existing topic's attributes (same JSON as create; its shard count stays)."""
    st = state(ctx)
    topic = Topic.from_json(_json(data, file))
    registry = _registry(st)
    with registry.queues:
        _show_topic(st, registry.set_topic(topic))


@topic_app.command("rm")
def topic_rm(ctx: typer.Context, name: str, yes: Yes = False) -> None:
    """Delete a topic, its configurations and its queues with their pending notifications."""
    st = state(ctx)
    registry = NotificationRegistry(st.open_queues())
    with registry.queues:
        topic = registry.get_topic(name)
        pending = registry.topic_stats(name).entries if topic.persistent else 0
        confirm(f"delete topic {name} and its configurations, with {pending} pending notifications", yes)
        if not registry.delete_topic(name):
            raise TopicNotFound(f"no notification topic {name!r}")
    st.out.record({"deleted": name, "pending_dropped": pending})


@config_app.command("put")
def config_put(ctx: typer.Context, data: Data = None, file: File = None) -> None:
    """Create or replace a configuration: {"id", "source", "topic", "actions"?, "prefix"?, "suffix"?};
    its topic must exist."""
    st = state(ctx)
    config = NotificationConfig.from_json(_json(data, file))
    registry = NotificationRegistry(st.open_queues())
    with registry.queues:
        registry.get_topic(config.topic)  # a configuration of no topic would notify nobody
        registry.put_configuration(config)
    st.out.record(json.loads(config.to_json()))


@config_app.command("rm")
def config_rm(
    ctx: typer.Context, source: str,
    config_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="Only this one (default: all of SOURCE).")]
    = None,
    yes: Yes = False,
) -> None:
    """Delete the configuration ID of SOURCE, or all of SOURCE's."""
    st = state(ctx)
    registry = NotificationRegistry(st.open_queues())
    with registry.queues:
        what = f"configuration {config_id} of {source}" if config_id else f"every configuration of {source}"
        confirm(f"delete {what}", yes)
        removed = registry.delete_configuration(source, config_id)
    if not removed:
        raise NotFound(f"no {what}")
    st.out.record({"source": source, "id": config_id, "deleted": removed})

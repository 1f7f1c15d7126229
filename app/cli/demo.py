"""`cacheroute demo`: the main job. For now: a real broker, the topics, and one event round trip.

The live demo (synthetic gateways -> streams agent -> planner -> dispatchers, with a terminal view)
replaces this body when the demo issue lands; the command name stays.
"""

from __future__ import annotations

import time

import click
from confluent_kafka import Producer
from rich.console import Console
from rich.panel import Panel

from cacheroute.cli.kafka import broker_for
from cacheroute.cli.topics import render_outcomes
from cacheroute.errors import CacheRouteError
from cacheroute.kafkaio import produce_sync, producer_config, read_partition
from cacheroute.localkafka import resolve_distribution
from cacheroute.localkafka.broker import broker_answers
from cacheroute.schemas import RequestEvent, codec_for
from cacheroute.settings import Settings
from cacheroute.topics import ensure_topics

__all__ = ["demo"]


@click.command()
@click.option("--key", default="tenant-42/conversation-7", show_default=True, help="Routing key.")
@click.option("--no-broker", is_flag=True, help="Use the broker at --bootstrap; do not start one.")
@click.pass_obj
def demo(settings: Settings, key: str, no_broker: bool) -> None:
    """Start a local broker, create the topics, send a sample request event and read it back."""
    console = Console()
    if not no_broker:
        broker = broker_for(settings)
        dist = resolve_distribution(settings, console=console)
        with console.status(f"Starting Kafka {dist.version} at {broker.bootstrap} ..."):
            started = broker.start(dist)
        state = "was already running" if started.already_running else "started"
        console.print(f"[green]Kafka {dist.version} {state}[/] at {started.bootstrap}")
    elif not broker_answers(settings.bootstrap):
        raise CacheRouteError(f"no broker answers at {settings.bootstrap}")

    render_outcomes(ensure_topics(settings), console)

    codec = codec_for(RequestEvent)
    event = RequestEvent(
        key=key,
        event_time_ms=time.time_ns() // 1_000_000,
        gateway_id="demo-gateway",
        prompt_tokens=1834,
        prefix_tokens=1536,
        prefix_block_hashes=[0x1F2E3D4C, 0x5A6B7C8D, 0x0BADCAFE],
    )
    topic = settings.topics["requests"]
    producer = Producer(producer_config(settings))
    sent = produce_sync(producer, topic, codec.encode(event), key=key.encode())
    back = read_partition(settings, topic, sent.partition, start=sent.offset)
    if not back or back[0].offset != sent.offset or back[0].value is None:
        raise CacheRouteError(f"could not read back {sent.where}")
    decoded = codec.decode(back[0].value, topic=topic, partition=sent.partition, offset=sent.offset)
    ok = decoded == event
    console.print(
        Panel(
            f"sent     {codec.to_json(event).decode()}\n"
            f"at       {sent.where} ({len(back[0].value)} bytes, Avro single-object encoding)\n"
            f"read     {codec.to_json(decoded).decode()}\n"
            f"result   {'[green]round trip OK[/]' if ok else '[red]MISMATCH[/]'}",
            title="RequestEvent round trip",
            title_align="left",
        )
    )
    if not ok:
        raise CacheRouteError("the event read back differs from the one sent")
    if not no_broker:
        console.print("The broker keeps running; stop it with `cacheroute kafka stop`.")

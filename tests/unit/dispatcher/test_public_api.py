"""The gateway's API is importable from `cacheroute.dispatcher`, lazily: a pure module stays pure."""

from __future__ import annotations

import subprocess
import sys


def test_the_public_names_come_from_the_package() -> None:
    import cacheroute.dispatcher as api  # noqa: PLC0415 - the import is what is tested
    from cacheroute.dispatcher.dispatcher import Dispatcher  # noqa: PLC0415
    from cacheroute.dispatcher.emitter.emitter import Emitter  # noqa: PLC0415

    assert api.Dispatcher is Dispatcher
    assert api.Emitter is Emitter
    assert set(api.__all__) >= {"Dispatcher", "DispatcherConfig", "Emitter", "EmitterConfig"}


def test_importing_the_router_loads_no_kafka_client() -> None:
    code = (
        "import sys; import cacheroute.dispatcher.routing; "
        "print('confluent_kafka' in sys.modules, 'faust' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"]

"""Every public error the project defines derives from `CacheRouteError`, so one `except` (the CLI's)
catches them all; library errors that callers catch as `ValueError` stay `ValueError`s too."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import cacheroute
from cacheroute.dispatcher.errors import DispatchError
from cacheroute.errors import CacheRouteError
from cacheroute.planner.errors import PlannerError
from cacheroute.schemas import SchemaError
from cacheroute.streams.state import BatchError


def _project_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(cacheroute.__path__, "cacheroute."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not obj.__name__.startswith("_")  # private control flow inside one module
            ):
                found.append(obj)
    return found


def test_every_public_project_error_derives_from_the_one_root() -> None:
    errors = _project_exceptions()
    names = {e.__name__ for e in errors}
    # the walk really sees the library errors (else the check below would pass on nothing)
    assert {"DispatchError", "PlannerError", "SchemaError", "BatchError", "ReplayError"} <= names
    strays = [f"{e.__module__}.{e.__name__}" for e in errors if not issubclass(e, CacheRouteError)]
    assert strays == []


def test_library_errors_are_still_value_errors() -> None:
    for error in (DispatchError, PlannerError, SchemaError, BatchError):
        assert issubclass(error, ValueError)
    assert str(PlannerError("bad rate", key="k")) == "bad rate"
    assert SchemaError("truncated", topic="t", partition=1, offset=2).partition == 1

"""Build hook: compile the gateway's routing hot path (`dispatcher/routing.py`) with mypyc.

Every request a gateway serves runs `Router.route_index` and the in-flight counters; compiled,
they take ~20-45% less time per decision than interpreted (`cacheroute bench dispatcher`, README).
Everything else stays pure Python, and so does routing when compiling is not possible: no C
compiler, `CACHEROUTE_PURE_PYTHON=1` at install time, or any mypyc error (the build says so and
goes on). `cacheroute.dispatcher.routing.COMPILED_FROM` tells which one a process runs.

mypyc names a module after its folders, and the areas are mapped under `cacheroute.*` (see
pyproject.toml), so the module is compiled from a staged copy laid out as `cacheroute/dispatcher/`,
together with the modules it imports (for their types). The staged copy records the SHA-256 of
the source it was made from, so an editable install whose routing.py was edited afterwards warns
at import (rebuild with `make install`) and a test fails instead of running stale code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
STAGE = Path("build") / "mypyc-src"
# (source, staged path): the compiled module first, then what it imports, for their types
FILES = (
    ("dispatcher/routing.py", "cacheroute/dispatcher/routing.py"),
    ("dispatcher/prefixes.py", "cacheroute/dispatcher/prefixes.py"),
    ("dispatcher/errors.py", "cacheroute/dispatcher/errors.py"),
    ("app/errors.py", "cacheroute/errors.py"),
)
MARKER = "COMPILED_FROM: str | None = None"


def _stage() -> Path:
    """Copy the sources into a `cacheroute/` layout; returns the staged routing.py."""
    shutil.rmtree(STAGE, ignore_errors=True)
    for source, staged in FILES:
        target = STAGE / staged
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in (target.parent, target.parent.parent):
            if parent != STAGE:
                (parent / "__init__.py").touch()
        text = (HERE / source).read_text(encoding="utf-8")
        if staged.endswith("routing.py"):
            if MARKER not in text:
                raise RuntimeError(f"{source}: no `{MARKER}` line to record the source in")
            digest = hashlib.sha256((HERE / source).read_bytes()).hexdigest()
            text = text.replace(MARKER, f'COMPILED_FROM: str | None = "{digest}"', 1)
        target.write_text(text, encoding="utf-8")
    return STAGE / FILES[0][1]


class OptionalMypycBuild(build_ext):
    """Generate the C code when the build runs (not at every `setup.py` call, which pip makes
    several of), and build the pure-Python package if anything about it fails."""

    def run(self) -> None:
        self.extensions = self.distribution.ext_modules = _generate()
        # what `finalize_options` did for the placeholder, for mypyc's extensions
        self.check_extensions_list(self.extensions)
        for ext in self.extensions:
            name = ext._full_name = self.get_ext_fullname(ext.name)
            self.ext_map[name] = ext
            ext._links_to_dynamic = ext._needs_stub = False
            ext._file_name = self.get_ext_filename(name)
        try:
            super().run()
        except Exception as exc:
            _fallback(exc)
            self.extensions = []


def _generate() -> list[Extension]:
    """mypyc's extensions for the staged routing.py ([] when it cannot: see the docstring)."""
    if os.environ.get("CACHEROUTE_PURE_PYTHON"):
        print("CACHEROUTE_PURE_PYTHON is set: routing stays pure Python", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify  # noqa: PLC0415 - a build requirement only

        routing = _stage()
        return list(
            mypycify(
                [str(routing), "--ignore-missing-imports", "--config-file", ""],
                target_dir=str(STAGE.parent / "mypyc"),
            )
        )
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error; pure Python works
        _fallback(exc)
        return []


def _fallback(exc: BaseException) -> None:
    print(
        f"warning: compiling dispatcher/routing.py with mypyc failed ({exc!r}); routing stays "
        "pure Python (slower per request, same decisions)",
        file=sys.stderr,
    )


# a placeholder so setuptools runs build_ext and tags the wheel for this platform;
# `finalize_options` replaces it with what mypyc generates
setup(
    ext_modules=[Extension("cacheroute.dispatcher.routing", sources=[])],
    cmdclass={"build_ext": OptionalMypycBuild},
)

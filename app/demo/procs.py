"""Child processes of the demo: started with a log file, stopped by pid (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

__all__ = ["Child", "run_child_command", "start_child"]


@dataclass
class Child:
    """One process the demo started."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    reader: threading.Thread | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, wait, then SIGKILL this process only (by pid)."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.reader is not None:
            self.reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_child(
    name: str,
    args: list[str],
    log: Path,
    *,
    on_line: Callable[[bytes], None] | None = None,
) -> Child:
    """Start `python <args>` with stderr (and stdout unless `on_line` reads it) to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if on_line is not None else out,
            stderr=out,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops children itself
        )
    child = Child(name, proc, log)
    if on_line is not None and proc.stdout is not None:
        stream = proc.stdout

        def pump() -> None:
            for line in stream:
                on_line(line)

        child.reader = threading.Thread(target=pump, name=f"demo-{name}-stdout", daemon=True)
        child.reader.start()
    return child


def run_child_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a child process's click command on `argv`; its exit code (usage errors: one line, 2)."""
    try:
        code = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    return int(code or 0)

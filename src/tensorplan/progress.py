"""One transient progress bar for long loops (rich), or a no-op where the caller asked for none."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n=1)`; the bar disappears when the block ends (also on an exception)."""
    if not enabled:
        yield lambda n=1: None
        return
    from rich.progress import Progress
    bar = Progress(transient=True)
    bar.start()
    task = bar.add_task(label, total=total)
    try:
        yield lambda n=1: bar.update(task, advance=n)
    finally:
        bar.stop()

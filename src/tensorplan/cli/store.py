"""`tensorplan store ...`: inspect and export the measurement store.

Parses, calls `tensorplan.Store` and prints."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

store_app = typer.Typer(help="Inspect and export the measurement store (SQLite).", no_args_is_help=True)

_STORE_OPT = typer.Option(None, "--store", help="Store file (default: $TENSORPLAN_STORE or <cache>/store.sqlite).")


@store_app.command("stats")
def stats(store: Optional[Path] = _STORE_OPT,
          json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Counts per table, program kind and device; file size; schema version."""
    import tensorplan as tp
    from tensorplan.errors import StoreError

    if store is not None and not store.exists():
        raise StoreError(f"store '{store}' does not exist; pass an existing --store file")
    s = tp.Store(store).stats()
    if json_out:
        print(json.dumps(s, indent=1))
        return
    con = Console()
    con.print(f"[bold]{s['path']}[/]  schema v{s['schema_version']}, {s['file_bytes'] / 1e6:.2f} MB")
    t = Table(show_header=True)
    t.add_column("what")
    t.add_column("count", justify="right")
    for k in ("devices", "programs", "measurements"):
        t.add_row(k, str(s[k]))
    for title, key in (("programs of kind", "programs_by_kind"), ("measurements of kind", "measurements_by_kind"),
                       ("measurements on", "measurements_by_device"), ("job", "jobs_done")):
        for name, n in s[key].items():
            t.add_row(f"{title} {name}", str(n))
    con.print(t)


@store_app.command("export")
def export(parquet: Path = typer.Option(..., "--parquet", help="Directory for one parquet file per table."),
           store: Optional[Path] = _STORE_OPT) -> None:
    """Export every table to parquet (for training sets)."""
    import tensorplan as tp
    from tensorplan.errors import StoreError

    from tensorplan.cli.common import output_dir

    output_dir(parquet, "--parquet")
    if store is not None and not store.exists():
        raise StoreError(f"store '{store}' does not exist; pass an existing --store file")
    files = tp.Store(store).export_parquet(parquet)
    for table, f in files.items():
        print(f"{table}: {f}")


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")

"""`tensorplan devices`: this machine's devices (measured) and the catalog of known devices.

Parses, calls `tensorplan.devices` and prints."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command("devices")
    def devices(
        json_out: bool = typer.Option(False, "--json", help="Print JSON (local devices and catalog)."),
        refresh: bool = typer.Option(False, "--refresh", help="Re-measure bandwidth and GEMM FLOP/s of this CPU."),
        local_only: bool = typer.Option(False, "--local", help="Only this machine's devices."),
        quick: bool = typer.Option(False, "--quick", help="Tiny probes (well under a second, less accurate) "
                                   "when nothing is cached yet."),
        save: Path = typer.Option(None, "--save", help="Also write this CPU's spec ('local') to this JSON file; "
                                  "every --device option accepts the file."),
    ) -> None:
        """Show this machine's CPU (measured bandwidth / GEMM FLOP/s, cached) and GPUs, and the known catalog."""
        import tensorplan as tp
        from tensorplan.cli.common import output_file

        output_file(save, "--save")
        con = Console(stderr=True)
        if refresh:
            con.print("measuring bandwidth and GEMM FLOP/s (a few seconds per thread count)...")
        local = tp.devices.local_devices(refresh=refresh, quick=quick)
        cat = [] if local_only else [tp.devices.CATALOG[k] for k in sorted(tp.devices.CATALOG)]
        if save is not None:
            con.print(f"wrote {local[0].save(save)} ({local[0].short()})")
        if json_out:
            print(json.dumps({"local": [d.to_dict() for d in local], "catalog": [d.to_dict() for d in cat]}, indent=1))
            return
        _print(Console(), local, cat)


def _print(out: Console, local: list, cat: list) -> None:
    for title, rows in (("this machine (measured)", local), ("catalog (datasheet)", cat)):
        if not rows:
            continue
        t = Table(title=title)
        for col in ("name", "kind", "model", "cores/SMs", "threads", "GHz", "GFLOP/s fp32", "GB/s", "L1/L2/L3 KiB", "ISA"):
            t.add_column(col, overflow="fold")
        for d in rows:
            t.add_row(d.name, d.kind, d.model, str(d.cores), str(d.threads), f"{d.clock_ghz:.2f}",
                      f"{d.peak_fp32_gflops:,.0f}", f"{d.mem_bw_gbs:,.1f}",
                      f"{d.l1_kb:g}/{d.l2_kb:g}/{d.l3_kb:g}", ",".join(d.isa))
        out.print(t)
    for d in local:
        if d.kind == "cpu" and d.measured:
            load = d.extra.get("load_avg_1m_when_measured")
            busy = load is not None and load > d.threads
            out.print(f"[dim]{d.name}: GEMM via {d.extra.get('gemm_backend')}, copy {d.extra.get('copy_gbs')} GB/s, "
                      f"measured {d.extra.get('measured_at')}"
                      + (f" (load {load:.1f}, quick probes)" if d.extra.get("quick") else
                         f" (load {load:.1f})" if load is not None else "") + "[/]"
                      + ("  [yellow]machine was busy: rerun with --refresh when idle[/]" if busy else ""))

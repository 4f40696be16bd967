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
        json_out: bool = typer.Option(False, "--json", help="Print JSON (local devices, the precisions each runs "
                                      "natively, and the catalog)."),
        refresh: bool = typer.Option(False, "--refresh", help="Re-measure bandwidth and GEMM FLOP/s of this CPU."),
        local_only: bool = typer.Option(False, "--local", help="Only this machine's devices."),
        quick: bool = typer.Option(False, "--quick", help="Tiny probes (well under a second, less accurate) "
                                   "when nothing is cached yet."),
        save: Path = typer.Option(None, "--save", help="Also write this CPU's spec ('local') to this JSON file; "
                                  "every --device option accepts the file."),
        ray_resources: bool = typer.Option(False, "--ray-resources", help="Print only the Ray resources this "
                                           "machine's devices register as (JSON for `ray start --resources`), so "
                                           "--ray-address jobs for them can run here."),
    ) -> None:
        """Show this machine's CPU and GPUs (measured, cached), the precisions each runs natively, and the catalog."""
        import tensorplan as tp
        from tensorplan.precision import native_precisions
        from tensorplan.cli.common import output_file

        output_file(save, "--save")
        con = Console(stderr=True)
        if refresh:
            con.print("measuring bandwidth and GEMM FLOP/s (a few seconds per thread count)...")
        from tensorplan.measure.cluster import device_resource, node_resources
        local = tp.devices.local_devices(refresh=refresh, quick=quick)
        if ray_resources:
            print(json.dumps(node_resources(local)))
            return
        cat = [] if local_only else [tp.devices.CATALOG[k] for k in sorted(tp.devices.CATALOG)]
        if save is not None:
            con.print(f"wrote {local[0].save(save)} ({local[0].short()})")
        precisions = {d.name: native_precisions(d) for d in local}
        if json_out:
            print(json.dumps({"local": [{**d.to_dict(), "ray_resource": device_resource(d)} for d in local],
                              "catalog": [d.to_dict() for d in cat],
                              "precisions": {n: {p: s.to_dict() for p, s in ps.items()}
                                             for n, ps in precisions.items()}}, indent=1))
            return
        _print(Console(), local, cat)
        _print_precisions(Console(), local, precisions)
        Console().print(f"[dim]Ray resources of this machine's devices (`ray start --resources '...'`, for "
                        f"--ray-address): {json.dumps(node_resources(local))}[/]")


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


def _print_precisions(out: Console, local: list, precisions: dict) -> None:
    """Which precisions each local processor runs natively and through which units (one table per
    processor: the thread-count variants of one CPU share it)."""
    shown: set[tuple[str, str]] = set()
    for d in local:
        if (d.kind, d.model) in shown:
            continue
        shown.add((d.kind, d.model))
        t = Table(title=f"precisions on {d.model or d.name}")
        for col in ("precision", "native", "via", "note"):
            t.add_column(col, overflow="fold")
        for s in precisions[d.name].values():
            t.add_row(s.precision, "yes" if s.native else "[yellow]no (emulated)[/]"
                      + (" [dim]-- auto tries it[/]" if s.may_gain and not s.native else ""), s.via, s.note)
        out.print(t)

"""`tensorplan orchestrate`: Korch-style kernel orchestration of a model into a Plan (JSON).

Parses, makes one call (`tensorplan.orchestrate`) and prints the plan's summary."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cli.common import MODEL_HELP, input_shape_option, output_file, parse_shapes


def register(app: typer.Typer) -> None:
    @app.command()
    def orchestrate(
        model: str = typer.Argument(..., help=MODEL_HELP),
        output: Path = typer.Option(None, "-o", "--output", help="Write the plan JSON here."),
        cost: str = typer.Option("measured", "--cost", help="Kernel cost model: measured (compile and time "
                                 "every candidate kernel on this machine, cached in the store), predicted "
                                 "(CDMPP ranks sampled schedules of TIR kernels, a work model fitted on "
                                 "measured kernels prices the rest; nothing timed; see `tensorplan optimize`), "
                                 "analytical "
                                 "(roofline from the device's figures, no measuring) or torch (PyTorch-built "
                                 "kernels timed on the device; the default on a GPU device)."),
        device: str = typer.Option("local", help="Device: local (this CPU, every usable core), local-<N>t, cuda "
                                                 "(this machine's GPU: kernels built with PyTorch, the plan runs "
                                                 "as one CUDA graph), a catalog name (`tensorplan devices`) or a "
                                                 "spec file saved with `tensorplan devices --save`."),
        input_shape: list[str] = input_shape_option(),
        opset: int = typer.Option(17, help="Opset of a zoo or PyTorch export (ONNX files keep theirs)."),
        max_nodes: int = typer.Option(8, "--max-nodes", min=1, help="Size cap of a fused kernel (primitives)."),
        max_reduces: int = typer.Option(2, "--max-reduces", help="Max reduce primitives per kernel (-1: no cap)."),
        no_recompute: bool = typer.Option(False, "--no-recompute", help="Forbid recomputing primitives."),
        linear_epilogue: bool = typer.Option(False, "--linear-epilogue",
                                             help="Let MatMul/Conv absorb an elementwise epilogue."),
        method: str = typer.Option("blp", help="blp (Korch), greedy (greedy fusion) or none (no fusion)."),
        no_cuts: bool = typer.Option(False, "--no-cuts", help="Solve the BLP without the valid cuts."),
        time_limit: float = typer.Option(60.0, "--time-limit", help="Solver time limit (seconds)."),
        regions: bool = typer.Option(True, "--regions/--no-regions",
                                     help="Also offer ONNX Runtime regions (runs of original operators as one "
                                          "session) to the BLP; needs --cost measured or predicted."),
        region_segments: int = typer.Option(8, "--region-segments", min=1,
                                            help="Longest region, in linear-operator segments (dyadic beyond)."),
        kernel_overhead: float = typer.Option(0.0, "--kernel-overhead",
                                              help="Seconds added per kernel in the BLP objective: what a kernel "
                                                   "boundary costs inside a running plan beyond its solo time."),
        rewrite: bool = typer.Option(True, "--rewrite/--no-rewrite",
                                     help="Apply exact algebraic rewrites first (e.g. 1x1 convolutions moved "
                                          "before upsampling, identity resizes dropped)."),
        winograd: bool = typer.Option(False, "--winograd",
                                      help="Also run every eligible 3x3 convolution as Winograd F(4x4,3x3) "
                                           "(exact up to rounding)."),
        race: bool = typer.Option(True, "--race/--no-race",
                                  help="Run the BLP plan end to end against its alternatives (fewest kernels, "
                                       "no recomputation), interleaved on this machine, and keep the winner."),
        race_inductor: bool = typer.Option(True, "--race-inductor/--no-race-inductor",
                                           help="Also race the whole rewritten graph as one PyTorch Inductor "
                                                "program (CPU plans; compiling it adds time)."),
        race_rounds: int = typer.Option(15, "--race-rounds", min=1, help="Interleaved rounds of the race."),
        race_margin: float = typer.Option(0.10, "--race-margin",
                                          help="A plan with more kernels is kept only if it beats every "
                                               "fewer-kernel finalist by this fraction."),
        threads: int = typer.Option(None, "--threads", help="Threads kernels are timed and plans raced with "
                                    "(default: the device's; every usable core for local)."),
        jobs: int = typer.Option(1, "--jobs", min=1, help="With torch-built kernels (--device cuda, --cost torch): "
                                 "processes that pre-compile the candidates in parallel."),
        ray_address: str = typer.Option(None, "--ray-address", help="Compile and time the kernels (--cost "
                                        "measured) on this Ray cluster's workers that offer the device "
                                        "(`ray start --resources`, see `tensorplan devices --ray-resources`); "
                                        "'auto': the cluster this machine belongs to. Timings land in this "
                                        "machine's store."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan summary as JSON."),
    ) -> None:
        """Fission, candidate kernels, measured costs, BLP, end-to-end race: a verified plan."""
        import tensorplan as tp

        from tensorplan.cli.common import one_line_errors
        from tensorplan.errors import TensorplanError
        err = Console(stderr=True)
        with one_line_errors():
            for flag, v, lo in (("--race-rounds", race_rounds, 1), ("--max-nodes", max_nodes, 1),
                                ("--region-segments", region_segments, 1), ("--jobs", jobs, 1),
                                ("--threads", threads, 1)):
                if v is not None and v < lo:
                    raise TensorplanError(f"{flag} {v}: give a count >= {lo}")
            output_file(output, "--output")
            plan = tp.orchestrate(
                model, device=device, cost=cost, input_shapes=parse_shapes(input_shape), opset=opset,
                threads=threads, jobs=jobs, method=method, max_nodes=max_nodes,
                max_reduces=None if max_reduces < 0 else max_reduces, linear_epilogue=linear_epilogue,
                recompute=not no_recompute, cuts=not no_cuts, time_limit=time_limit,
                regions=None if regions else False, region_segments=region_segments,
                kernel_overhead_s=kernel_overhead, rewrite=rewrite, winograd=winograd, race=race,
                race_inductor=race_inductor, race_rounds=race_rounds, race_margin=race_margin, progress=not as_json,
                log=None if as_json else (lambda m: err.print(f"[dim]·[/] {m}")), ray_address=ray_address)
            if output is not None:
                plan.save(output)
        summ = plan.summary()
        if as_json:
            print(json.dumps({**summ.to_dict(), "plan": str(output) if output else None}, indent=2, default=str))
            return
        _print(Console(), plan, summ, output)


def _print(con: Console, plan, summ, output: Path | None) -> None:
    t = Table(title=f"plan for {summ.model} on {summ.device}", show_header=False)
    t.add_row("kernels", f"{summ.kernels} " + ", ".join(f"{k}: {v}" for k, v in summ.kinds.items()))
    t.add_row("predicted latency", f"{plan.predicted_s * 1e3:.3f} ms  (unfused "
              f"{plan.stats.get('unfused_s', 0) * 1e3:.3f} ms)")
    sv = plan.solver
    gap = sv.get("mip_gap")
    t.add_row("solver", f"{sv.get('method')} {sv.get('status')}, gap "
              f"{'-' if gap is None else f'{gap:.2e}'}, {sv.get('solve_s', 0):.2f}s, "
              f"{sv.get('variables')} vars / {sv.get('constraints')} rows")
    t.add_row("recomputed primitives", str(summ.recomputed_primitives))
    if summ.race:
        t.add_row("race", ", ".join(f"{k} {v:.3f} ms" for k, v in summ.race["median_ms"].items())
                  + f" -> kept {summ.race['chosen']}")
    reg = plan.stats.get("ort_regions") or {}
    if reg.get("candidates"):
        t.add_row("ONNX Runtime regions", f"{reg.get('kernels_after_merge', 0)} kernels covering "
                  f"{reg.get('primitives', 0)} of {plan.source.get('num_primitives')} primitives "
                  f"({reg['candidates']} region candidates)")
    t.add_row("buffer arena", f"{summ.arena_bytes / 2**20:.1f} MiB in {len(plan.slots)} slots")
    t.add_row("time", ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in summ.timing.items()))
    rw = Counter(rule for rule, _ in summ.rewrites)
    t.add_row("rewrites", ", ".join(f"{k} x{v}" for k, v in rw.items()) or "none")
    op = summ.opaque
    t.add_row("opaque ops", ", ".join(f"{o} ({n})" for n, o in op[:8]) + (" ..." if len(op) > 8 else "")
              if op else "none")
    if output:
        t.add_row("written", str(output))
        t.add_row("next", f"tensorplan run {output}  (time it, check it);  tensorplan export {output} -o "
                          f"{Path(output).name.split('.')[0]}.onnx  (one ONNX file for stock ONNX Runtime)")
    con.print(t)

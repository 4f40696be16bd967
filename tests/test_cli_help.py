"""The CLI's command lists: every command has `--help`, and its summary line is one sentence, so
`tensorplan --help` and `tensorplan predictor dataset --help` list commands without ragged line breaks."""
from __future__ import annotations

import inspect
import typing

import typer
from typer.models import OptionInfo
from typer.testing import CliRunner

from tensorplan.cli import app


def _commands(a: typer.Typer, prefix: tuple[str, ...] = ()):
    for c in a.registered_commands:
        yield prefix + ((c.name or c.callback.__name__.replace("_", "-")),), c.callback
    for g in a.registered_groups:
        yield from _commands(g.typer_instance, prefix + (g.name,))


def test_every_command_has_help_with_a_one_line_summary():
    cmds = list(_commands(app))
    assert len(cmds) >= 20          # predict, orchestrate, dataset collect, store stats, ...
    runner = CliRunner()
    for path, fn in cmds:
        doc = inspect.getdoc(fn) or ""
        summary = doc.split("\n\n")[0]
        assert summary and "\n" not in summary, f"`tensorplan {' '.join(path)}`: summary spans lines: {summary!r}"
        r = runner.invoke(app, [*path, "--help"])
        assert r.exit_code == 0 and "Usage" in r.stdout, (path, r.output[-300:])


# Options that count something (runs, rounds, tasks, workers, ...): each must carry a typer range
# (`min=`), so 0 or a negative value is one clear usage error, never a traceback deep inside a job.
_COUNT_WORDS = ("repeats", "rounds", "batch", "tasks", "per-task", "epochs", "members", "steps", "limit",
                "workers", "jobs", "seed", "tuned", "max-nodes", "segments")
# Count options of commands whose files other work owns (issue 60): each still needs `min=`;
# remove an entry once its option has one.
_PENDING: set = set()


def _count_options():
    for path, fn in _commands(app):
        hints = typing.get_type_hints(fn)
        for name, prm in inspect.signature(fn).parameters.items():
            d = prm.default
            if not isinstance(d, OptionInfo) or hints.get(name) not in (int, typing.Optional[int]):
                continue
            opt = next((x for x in (d.param_decls or ()) if x.startswith("--")), "--" + name.replace("_", "-"))
            if any(w in opt for w in _COUNT_WORDS):
                yield " ".join(path), opt, d


def test_every_count_option_refuses_zero_or_negative():
    opts = list(_count_options())
    assert len(opts) >= 20
    missing = [(cmd, opt) for cmd, opt, d in opts if d.min is None and (cmd, opt) not in _PENDING]
    assert not missing, f"count options without min= (0 or a negative value would reach the job): {missing}"

"""The CLI's command lists: every command has `--help`, and its summary line is one sentence, so
`tensorplan --help` and `tensorplan predictor dataset --help` list commands without ragged line breaks."""
from __future__ import annotations

import inspect

import typer
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

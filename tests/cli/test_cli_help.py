"""Every option of every ``fedfilter`` sub-command explains itself, and packaged studies resolve by name."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from fedfilter.cli import build_parser, main
from fedfilter.cli.study import packaged_configs, study_config

REPO = Path(__file__).resolve().parents[2]


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """(command path, action) for every action of every (sub-)parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), (None if name in helped else f"sub-command {name!r} has no help")
                yield from _walk(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_of_every_subcommand_has_help():
    missing = []
    for path, action in _walk(build_parser(), ("fedfilter",)):
        if isinstance(action, str):
            missing.append(f"{' '.join(path)}: {action}")
        elif action is not None and (not action.help or action.help == argparse.SUPPRESS):
            missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_the_walk_sees_the_options_it_checks():
    # The walker must reach nested sub-commands, or the test above passes on nothing.
    seen = {
        (" ".join(p), tuple(a.option_strings))
        for p, a in _walk(build_parser(), ("fedfilter",))
        if a and not isinstance(a, str)
    }
    assert ("fedfilter ledger enrol", ("--epsilon",)) in seen and ("fedfilter study dropout", ("--config",)) in seen


def test_packaged_studies_resolve_by_name_to_the_shipped_files():
    shipped = {p.stem: p.resolve() for p in (REPO / "fedfilter" / "simulations" / "configs").glob("*.toml")}
    assert {name: path.resolve() for name, path in packaged_configs().items()} == shipped
    assert study_config("smoke").resolve() == shipped["smoke"] == study_config("smoke.toml").resolve()


def test_a_file_wins_over_a_packaged_name_and_an_unknown_name_lists_the_packaged_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").write_text("# mine\n")
    assert study_config("smoke") == Path("smoke")
    with pytest.raises(ValueError, match="packaged: .*smoke"):
        study_config("no-such-study")
    assert main(["study", "dropout", "--config", "no-such-study", "--dry-run"]) == 2
    assert "neither a file nor a packaged study" in capsys.readouterr().err


def test_study_help_names_packaged_studies_not_a_repository_path(capsys):
    with pytest.raises(SystemExit):
        main(["study", "dropout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config smoke" in text and "see simulations/configs" not in text


def test_a_command_that_needs_an_extra_names_it(monkeypatch, tmp_path, capsys):
    # A core install (`pip install fedfilter`) has no tqdm: the audit says which extra brings it.
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ModuleNotFoundError(name="tqdm")
    assert main(["audit", "--out", str(tmp_path), "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert "fedfilter audit needs tqdm" in err and 'pip install "fedfilter[app]"' in err, err

"""The command line: entry point, --help, --version."""

import subprocess
import sys

import pytest

from aiayn import __version__
from aiayn.cli.main import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"aiayn {__version__}"


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "copy-task" in capsys.readouterr().out


def test_help_and_a_wrong_command_import_no_subcommand_and_no_torch():
    """The commands' modules import torch (a second or more); ``aiayn --help`` and a typo answer without them."""
    code = ("import sys\nfrom aiayn.cli.main import COMMANDS, main\n"
            "for argv in (['--help'], ['-v', 'nosuch'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('aiayn.cli.') and m != 'aiayn.cli.main'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "invalid choice: 'nosuch'" in out.stderr


def test_every_command_has_its_arguments_and_runs_its_own_module():
    from aiayn.cli.main import COMMANDS, build_parser

    parser = build_parser()  # every command's arguments
    for name, command in COMMANDS.items():
        assert callable(command.entry(command.run)), name
    assert parser.parse_args(["generate", "--checkpoint", "x", "--prompt", "a", "--max-new-tokens", "3"]).max_new_tokens == 3
    assert build_parser(["recipes"]).parse_args(["recipes"]).command == "recipes"


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "aiayn", "--version"], capture_output=True, text=True, check=True)
    assert __version__ in out.stdout


def test_copy_task_rejects_bad_steps():
    with pytest.raises(SystemExit, match="--steps must be >= 1, got 0"):
        main(["copy-task", "--steps", "0"])


def test_copy_task_says_why_it_fails(capsys):
    """A missed pass mark exits 1 with the reason, not silently."""
    assert main(["copy-task", "--steps", "1", "--length", "3"]) == 1
    err = capsys.readouterr().err
    assert "below the pass mark of 90%" in err


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["train", "x.yaml", "--sett", "a=b"], "usage: aiayn train", "did you mean --set?"),
        (["translate", "--checkpoint", "x", "--beam-sise", "3"], "usage: aiayn translate", "did you mean --beam-size?"),
        (["bench", "attention", "--max-lem", "5"], "usage: aiayn bench attention", "did you mean --max-len?"),
    ],
)
def test_a_flag_typo_shows_the_subcommand_usage_and_a_suggestion(argv, usage, hint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments" in err and hint in err


def test_abbreviated_flags_are_refused(capsys):
    """--beam is not silently taken for --beam-size."""
    with pytest.raises(SystemExit):
        main(["evaluate", "--checkpoint", "x", "--split", "val", "--beam", "2"])
    assert "did you mean --beam-size?" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """`aiayn presets | head -0`: the reader is gone; no traceback, no error message."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w", buffering=1) as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        assert main(["presets"]) == 1
        monkeypatch.undo()
    assert capsys.readouterr().err == ""

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

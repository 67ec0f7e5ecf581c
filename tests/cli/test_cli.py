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

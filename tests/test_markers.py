"""The fast loop's markers stay honest: an unmarked test cannot start a server, and a test
that uses a server fixture is marked without anyone writing it down."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SERVER_FIXTURES
from servers import ServerGate, promtool


def test_an_unmarked_test_cannot_run_what_the_test_command_installs():
    assert not ServerGate.open  # the precondition: conftest closed the gate for this unmarked test
    with pytest.raises(RuntimeError, match=r"mark it @pytest.mark.server"):
        promtool()


@pytest.mark.server
def test_a_marked_test_can():
    assert ServerGate.open
    assert promtool().endswith("promtool")


def test_every_test_using_a_server_fixture_is_marked():
    # test_bridge_mariadb's tests all take a MariaDB fixture and carry no mark of their own.
    source = (Path(__file__).parent / "test_bridge_mariadb.py").read_text()
    assert "pytest.mark.server" not in source and "agent_db" in source  # the precondition

    def collected(marks: str) -> int:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                marks,
                str(Path(__file__).parent / "test_bridge_mariadb.py"),
            ],
            capture_output=True,
            text=True,
        )
        found = re.search(r"(\d+)(?:/\d+)? tests? collected", done.stdout)
        return int(found.group(1)) if found else 0

    assert collected("server") > 5
    assert collected("not server") == 0
    assert SERVER_FIXTURES >= {"agent_db", "mariadb"}

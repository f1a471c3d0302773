"""scripts/peers.sh fails with one line that says what to install, never silently; the peers it
builds are never given one port twice."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from servers import ROOT, free_port


def project_copy(tmp_path: Path) -> Path:
    """The script and the peers' modules, without built binaries or a virtualenv."""
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "tests" / "peers", copy / "tests" / "peers")
    return copy


def peers(copy: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(copy / "scripts" / "peers.sh")], capture_output=True, text=True, env=env, timeout=120)


def test_without_go_it_names_what_to_install(tmp_path):
    copy = project_copy(tmp_path)
    no_go = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "go").exists())
    assert shutil.which("go", path=no_go) is None
    done = peers(copy, {**os.environ, "PATH": no_go})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("peers: Go >= 1.26 is missing: install Go 1.26 or newer")
    assert not (copy / ".peers" / "bin" / "jaeger").exists()


def test_without_the_module_proxy_it_says_so_in_one_line(tmp_path):
    copy = project_copy(tmp_path)
    env = {**os.environ, "GOPROXY": "off", "GOMODCACHE": str(tmp_path / "empty-modcache"), "GOFLAGS": "-mod=mod"}
    done = peers(copy, env)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("peers: cannot download the Go modules of tests/peers/jaeger from off"), done.stderr
    assert "Go module proxy" in last


def test_no_two_peers_are_given_the_same_port():
    # A Jaeger given one port for both its query and its OTLP receiver exits at start.
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)

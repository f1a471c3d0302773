"""Log lines: JSON that parses, UTC times, no secrets, no scheduler chatter."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime, timedelta

from helpers import DaemonProcess, start_logging, write_config
from servers import free_port, wait_for

from run_otel.config import build_config


def _config(**log):
    return build_config(
        {
            "source": {"url": "mysql+pymysql://reader:pw-in-url-77@db/agent"},
            "export": {"headers": {"x-api-token": "hdr-secret-91"}},
            "log": {"format": "json", **log},
        }
    )


def test_json_lines_are_objects_with_a_utc_time(restore_logging):
    stream = io.StringIO()
    start_logging(_config(), stream)
    logging.getLogger("run_otel.test").warning("quote %r and \"double\" and 'single' and 中文", "x")
    try:
        raise ValueError("inner")
    except ValueError:
        logging.getLogger("run_otel.test").exception("with a traceback")
    lines = stream.getvalue().splitlines()
    docs = [json.loads(line) for line in lines]
    assert len(docs) == 2
    assert docs[0]["message"] == "quote 'x' and \"double\" and 'single' and 中文"
    assert docs[0]["level"] == "WARNING" and docs[0]["logger"] == "run_otel.test"
    assert "ValueError: inner" in docs[1]["exception"]
    for doc in docs:
        stamp = datetime.fromisoformat(doc["time"].replace("Z", "+00:00"))
        assert stamp.utcoffset() == timedelta(0)
        assert abs((datetime.now(stamp.tzinfo) - stamp).total_seconds()) < 60


def test_secrets_never_reach_a_log_line(restore_logging):
    stream = io.StringIO()
    start_logging(_config(format="text"), stream)
    log = logging.getLogger("some.library")
    log.error("connect mysql://reader:pw-in-url-77@db failed; header hdr-secret-91; MYSQL_PASSWORD=hunter2 token=tok-abc-123")
    try:
        raise RuntimeError("client_secret=s3cr3tval")
    except RuntimeError:
        log.exception("boom")
    out = stream.getvalue()
    for secret in ("pw-in-url-77", "hdr-secret-91", "hunter2", "tok-abc-123", "s3cr3tval"):
        assert secret not in out, secret
    assert "connect mysql://reader:" in out and "failed" in out
    # Text lines carry a UTC ISO time too.
    assert out.split(" ", 1)[0].endswith("Z")


def test_the_daemon_logs_json_and_no_scheduler_chatter(tmp_path):
    """A real daemon, polling an empty demo database every 0.2 s for a few seconds."""
    config = write_config(
        tmp_path / "c.toml",
        {
            "source": {"url": f"sqlite:///{tmp_path / 'agent.db'}"},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "poll": {"interval_seconds": 0.2, "start_from": "beginning"},
            "export": {"endpoint": f"127.0.0.1:{free_port()}"},
            "metrics": {"enabled": False},
            "log": {"format": "json"},
        },
    )
    from run_otel.ops.demo import generate, seed_demo_database

    seed_demo_database(tmp_path / "agent.db", generate(1, 0, datetime(2026, 1, 1)))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        wait_for(lambda: daemon.output().count("\n") >= 1, 30, "the start line")
        import time

        time.sleep(3)  # about 15 polls
    finally:
        assert daemon.terminate(30) == 0
    lines = daemon.output().splitlines()
    docs = [json.loads(line) for line in lines]
    assert not [d for d in docs if d["logger"].startswith("apscheduler")], lines
    assert len(docs) <= 6, lines


def test_the_json_stream_masks_secrets_and_a_rotated_password(restore_logging, tmp_path, monkeypatch):
    import sys

    from run_otel.mapping.masking import Scrubber, configured_secrets
    from run_otel.source.password_file import read_password
    from run_otel.telemetry.logs import configure_logging, scrub_output

    password_file = tmp_path / "password"
    password_file.write_text("first-pass-4471-abc\n")
    config = build_config(
        {
            "source": {"url": "mysql+pymysql://reader@db/agent", "password_file": str(password_file)},
            "export": {"headers": {"x-api-token": "hdr-secret-91"}},
            "log": {"format": "json"},
        }
    )
    # scrub_output wraps the process's stdout and stderr: put them back after the test.
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    stream = io.StringIO()
    scrubber = Scrubber.for_secrets(configured_secrets(config.export, config.source, config.state))
    configure_logging(config.log, scrub_output(scrubber), stream)  # as the command line wires them
    log = logging.getLogger("some.library")
    log.error("login with first-pass-4471-abc; header hdr-secret-91; MYSQL_PASSWORD=hunter2 token=tok-abc-123")
    try:
        raise RuntimeError("client_secret=s3cr3tval")
    except RuntimeError:
        log.exception("boom")
    password_file.write_text("second-pass-9921-xyz\n")  # rotated; the next connection reads it
    read_password(str(password_file))
    log.error("login with second-pass-9921-xyz refused")
    docs = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [doc["level"] for doc in docs] == ["ERROR", "ERROR", "ERROR"]  # precondition: every line is JSON
    out = stream.getvalue()
    for secret in ("first-pass-4471-abc", "hdr-secret-91", "hunter2", "tok-abc-123", "s3cr3tval", "second-pass-9921-xyz"):
        assert secret not in out, secret
    assert docs[2]["message"].startswith("login with ") and docs[2]["message"].endswith(" refused")

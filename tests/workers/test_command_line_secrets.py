"""Flower never serves the network without a login, and secrets given on the command line
(visible in `ps`) are warned about; files and the environment keep them out of it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.workers.cli_args import settings_from
from edgetrain.workers.processes.flower import FlowerConfigError, exposure_problem, is_loopback, read_basic_auth


def edgetrain(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgetrain.workers.cli", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize("address, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
                                               ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("flower.example", False)])  # fmt: skip
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_flower_on_the_network_needs_a_login(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLOWER_BASIC_AUTH", "FLOWER_AUTH"):
        monkeypatch.delenv(name, raising=False)
    assert "refusing to serve Flower on 0.0.0.0 without authentication" in exposure_problem("0.0.0.0", None)
    assert exposure_problem("0.0.0.0", "admin:pw") is None
    assert exposure_problem("127.0.0.1", None) is None
    monkeypatch.setenv("FLOWER_AUTH", r".*@example\.com")  # Flower's own OAuth
    assert exposure_problem("0.0.0.0", None) is None


def test_flower_refuses_to_start_on_the_network_without_a_login() -> None:
    result = edgetrain("flower", "--address", "0.0.0.0", "--port", "1", env={"FLOWER_BASIC_AUTH": "", "FLOWER_AUTH": ""})
    assert result.returncode == 2
    assert "edgetrain flower: refusing to serve Flower on 0.0.0.0 without authentication" in result.stderr
    assert "--basic-auth-file" in result.stderr


def test_basic_auth_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGETRAIN_FLOWER_BASIC_AUTH", raising=False)
    monkeypatch.delenv("EDGETRAIN_FLOWER_BASIC_AUTH_FILE", raising=False)
    assert read_basic_auth(None) is None
    (tmp_path / "auth").write_text("admin:from-file\n")
    assert read_basic_auth(tmp_path / "auth") == "admin:from-file"
    monkeypatch.setenv("EDGETRAIN_FLOWER_BASIC_AUTH_FILE", str(tmp_path / "auth"))
    assert read_basic_auth(None) == "admin:from-file"
    monkeypatch.delenv("EDGETRAIN_FLOWER_BASIC_AUTH_FILE")
    monkeypatch.setenv("EDGETRAIN_FLOWER_BASIC_AUTH", "admin:from-env")
    assert read_basic_auth(None) == "admin:from-env"
    (tmp_path / "bad").write_text("no-colon")
    with pytest.raises(FlowerConfigError, match="user:password"):
        read_basic_auth(tmp_path / "bad")
    with pytest.raises(FlowerConfigError, match="Flower credentials: cannot read"):
        read_basic_auth(tmp_path / "absent")


def test_secrets_on_the_command_line_are_warned_about() -> None:
    result = edgetrain("--redis-url", "redis://:s3cret@127.0.0.1:1/0", "flower", "--address", "0.0.0.0", "--basic-auth", "")
    assert "the secret in --redis-url is visible to every user of this machine" in result.stderr
    assert "EDGETRAIN_REDIS_URL_FILE" in result.stderr
    result = edgetrain("flower", "--basic-auth", "admin-without-password", "--redis-url", "redis://127.0.0.1:1/0")
    assert "the secret in --basic-auth is visible" in result.stderr and "--redis-url" not in result.stderr
    assert result.returncode == 2 and "Flower credentials must be user:password" in result.stderr


def test_the_redis_url_file_is_read_unless_the_command_line_gives_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    (tmp_path / "url").write_text("redis://:from-file@redis:6379/0\n")
    monkeypatch.setenv("EDGETRAIN_REDIS_URL_FILE", str(tmp_path / "url"))
    assert settings_from(argparse.Namespace(redis_url=None)).redis_url == "redis://:from-file@redis:6379/0"
    assert settings_from(argparse.Namespace(redis_url="redis://other:6379/0")).redis_url == "redis://other:6379/0"
    assert capsys.readouterr().err == ""  # no password on that command line
    settings_from(argparse.Namespace(redis_url="rediss://other:6379/0?password=pw"))
    assert "the secret in --redis-url" in capsys.readouterr().err

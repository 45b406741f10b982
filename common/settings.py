"""Settings from the environment (EDGETRAIN_*), or given explicitly by an entry point.

Two groups, read apart so that a command reads only what it needs: `DataSettings` (where data,
artifacts and user models may come from: validating a spec, reading a dataset) and `Settings`
(all of them: what a command that uses Redis or a worker needs). A setting edgetrain cannot use
raises SettingsError, one line per problem naming its variable. A path must be absolute: a
variable holds no folder to resolve a relative one against, and the same variable is read by
commands started in other folders (a systemd unit, cron, another shell)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .keys import DEFAULT_PREFIX
from .redis_address import sentinel_address
from .secret_files import read_secret, url_with_password

ENV_PREFIX = "EDGETRAIN_"


def env_name(field: str) -> str:
    """The environment variable that sets the setting `field`."""
    return f"{ENV_PREFIX}{field.upper()}"


class SettingsError(ValueError):
    """A setting has a value edgetrain cannot use; the message has one line per problem, each
    naming the variable (EDGETRAIN_<NAME>) and what is allowed."""

    @classmethod
    def of(cls, exc: ValidationError) -> SettingsError:
        """The problems of a failed validation of the settings, one line each."""
        lines = []
        for e in exc.errors():
            message = str(e["msg"]).removeprefix("Value error, ")
            lines.append(f"{env_name(str(e['loc'][0]))}: {message}" if e["loc"] else message)
        return cls("\n".join(lines))


def absolute_path(value: object) -> object:
    """`value` (a path setting) unless it is empty or relative (ValueError)."""
    if isinstance(value, str | Path) and not str(value).strip():
        raise ValueError("set but empty: give an absolute path, or unset it")
    if isinstance(value, str | Path) and not Path(value).is_absolute():
        raise ValueError(f"{str(value)!r} is a relative path, which each command would read from the folder it starts in: "
                         f"give an absolute path (from here: {Path(value).absolute()})")  # fmt: skip
    return value


class DataSettings(BaseSettings):
    """Where data, artifacts and user models may come from; `EDGETRAIN_<NAME>` sets <name>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    def __init__(self, **values: Any) -> None:
        """The settings from the environment, `values` overriding it; SettingsError, one line
        per problem, for a value edgetrain cannot use."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError.of(exc) from None

    artifact_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "artifacts")
    data_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "data")
    allowed_model_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated modules user models may be imported from; empty: registered models only"
    )
    data_roots: Annotated[tuple[Path, ...], NoDecode] = Field(
        (), description=f"{os.pathsep}-separated folders a dataset.path may point into; empty: data_dir only"
    )

    @field_validator("artifact_dir", "data_dir", mode="before")
    @classmethod
    def _absolute(cls, value: object) -> object:
        return absolute_path(value)

    @field_validator("allowed_model_modules", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return tuple(m.strip() for m in value.split(",") if m.strip()) if isinstance(value, str) else value

    @field_validator("data_roots", mode="before")
    @classmethod
    def _path_separated(cls, value: object) -> object:
        roots = tuple(p for p in value.split(os.pathsep) if p) if isinstance(value, str) else value
        return tuple(absolute_path(root) for root in roots) if isinstance(roots, tuple | list) else roots

    def readable_data_roots(self) -> tuple[Path, ...]:
        """Where user data may be read from: data_roots, else data_dir."""
        return self.data_roots or (self.data_dir,)


class Settings(DataSettings):
    """What every edgetrain process is configured with; `EDGETRAIN_<NAME>` sets <name>."""

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="redis://, rediss:// or unix:// URL, or Redis Sentinel: sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/MASTER/DB",
    )
    key_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9_.-]+$", description="prefix of edgetrain's Redis keys")
    heartbeat_s: float = Field(5.0, gt=0, description="fleet and worker heartbeat period (s)")
    heartbeat_ttl_s: float = Field(30.0, gt=0, description="a device or worker is gone after this long without a heartbeat (s)")
    lease_ttl_s: float = Field(20.0, gt=0, description="a running task whose process stops renewing its lease this long is lost (s)")
    reaper_interval_s: float = Field(5.0, gt=0, description="how often the control worker looks for lost tasks and devices (s)")
    checkpoint_every_s: float = Field(
        30.0, ge=0, description="a fine-tune checkpoints at the first evaluation this long after the last (s)"
    )
    task_max_retries: int = Field(3, ge=0, description="redeliveries of a task whose worker died")
    page_size: int = Field(50, gt=0, le=1000, description="devices of a job advanced by one job step")
    plan_window_s: float = Field(
        0.2, ge=0, le=2, description="a planning step waits this long (or for 6 jobs) for more submitted jobs, to plan them together (s)"
    )
    torch_threads: int = Field(0, ge=0, description="torch threads per worker process; 0 = torch's default")
    worker_max_memory_mb: int = Field(
        0, ge=0, description="a pool process whose peak resident memory passed this is replaced after its task (MB); 0: never"
    )
    control_time_limit_s: int = Field(300, gt=0, description="hard time limit of a job step (s)")
    profile_time_limit_s: int = Field(4 * 3600, gt=0, description="hard time limit of profiling one table (s)")
    training_time_limit_s: int = Field(12 * 3600, gt=0, description="hard time limit of a fine-tune, proxy run or pre-training (s)")
    visibility_timeout_s: int = Field(13 * 3600, gt=0, description="broker redelivery timeout (s): a last resort, longer than any task")
    job_retention_s: float = Field(
        7 * 24 * 3600, ge=0, description="how long a finished job stays in Redis (s); 0: until `edgetrain jobs prune`"
    )
    log_format: Literal["text", "json"] = Field("text", description="worker log lines: Celery's text, or one JSON object per line")
    metrics_jobs: int = Field(100, gt=0, le=10_000, description="the exporter reports the newest this many jobs (and every unfinished one)")

    @model_validator(mode="after")
    def _timeouts(self) -> Settings:
        longest = max(self.control_time_limit_s, self.profile_time_limit_s, self.training_time_limit_s)
        if self.visibility_timeout_s <= longest:
            raise ValueError(
                f"visibility_timeout_s={self.visibility_timeout_s} must be longer than the longest task time limit "
                f"({longest} s), or the broker redelivers tasks that are still running"
            )
        if self.lease_ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"lease_ttl_s={self.lease_ttl_s} must be longer than heartbeat_s={self.heartbeat_s} (leases renew at that period)"
            )
        return self

    # security (docs/security.md)
    redis_url_file: Path | None = Field(None, description="a file holding the Redis URL (its password stays out of `ps`)")
    redis_password_file: Path | None = Field(None, description="a file holding the password of the Redis URL's user")
    signing_key: Path | None = Field(None, description="PEM private key that signs the task messages this process sends")
    signing_certificate: Path | None = Field(None, description="PEM certificate of signing_key")
    signing_cert_store: Path | None = Field(None, description="folder of the PEM certificates whose signatures are accepted")

    @field_validator("redis_url_file", "redis_password_file", "signing_key", "signing_certificate", "signing_cert_store",
                     mode="before")  # fmt: skip
    @classmethod
    def _absolute_file(cls, value: object) -> object:
        return absolute_path(value)

    @model_validator(mode="after")
    def _redis_url_from_files(self) -> Settings:
        if self.redis_url_file is not None:
            self.redis_url = read_secret(env_name("redis_url_file"), self.redis_url_file)
        if self.redis_password_file is not None:
            self.redis_url = url_with_password(self.redis_url, read_secret(env_name("redis_password_file"), self.redis_password_file))
        sentinel_address(self.redis_url)  # a malformed Sentinel address is refused here, naming redis_url
        return self

    @model_validator(mode="after")
    def _signing_complete(self) -> Settings:
        given = {"signing_key": self.signing_key, "signing_certificate": self.signing_certificate,
                 "signing_cert_store": self.signing_cert_store}  # fmt: skip
        missing = [name for name, value in given.items() if value is None]
        if missing and len(missing) < len(given):
            raise ValueError(f"message signing needs signing_key, signing_certificate and signing_cert_store; missing: {missing}")
        return self

    @property
    def signing(self) -> bool:
        """Whether task messages are signed and only signed ones accepted."""
        return self.signing_key is not None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, from the environment (read once)."""
    return Settings()


@lru_cache(maxsize=1)
def get_data_settings() -> DataSettings:
    """Where this process reads data, artifacts and user models from, from the environment
    (read once; the other settings are not read, so that a command that needs only these
    works whatever the others hold)."""
    return DataSettings()


def reload_settings() -> None:
    """Read the environment again at the next `get_settings` and `get_data_settings`."""
    get_settings.cache_clear()
    get_data_settings.cache_clear()

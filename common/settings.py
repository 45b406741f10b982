"""Settings from the environment (EDGETRAIN_*), or given explicitly by an entry point."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .keys import DEFAULT_PREFIX


class Settings(BaseSettings):
    """What every edgetrain process is configured with; `EDGETRAIN_<NAME>` sets <name>."""

    model_config = SettingsConfigDict(env_prefix="EDGETRAIN_")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="redis://, rediss:// or unix:// URL")
    key_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9_.-]+$", description="prefix of edgetrain's Redis keys")
    artifact_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "artifacts")
    data_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "data")
    heartbeat_s: float = Field(5.0, gt=0, description="fleet and worker heartbeat period (s)")
    heartbeat_ttl_s: float = Field(30.0, gt=0, description="a device or worker is gone after this long without a heartbeat (s)")
    lease_ttl_s: float = Field(20.0, gt=0, description="a running task whose process stops renewing its lease this long is lost (s)")
    reaper_interval_s: float = Field(5.0, gt=0, description="how often the control worker looks for lost tasks and devices (s)")
    checkpoint_every_s: float = Field(30.0, ge=0, description="a fine-tune checkpoints at the first evaluation this long after the last (s)")
    task_max_retries: int = Field(3, ge=0, description="redeliveries of a task whose worker died")
    torch_threads: int = Field(0, ge=0, description="torch threads per worker process; 0 = torch's default")
    control_time_limit_s: int = Field(300, gt=0, description="hard time limit of a job step (s)")
    profile_time_limit_s: int = Field(4 * 3600, gt=0, description="hard time limit of profiling one table (s)")
    training_time_limit_s: int = Field(12 * 3600, gt=0, description="hard time limit of a fine-tune, proxy run or pre-training (s)")
    visibility_timeout_s: int = Field(13 * 3600, gt=0, description="broker redelivery timeout (s): a last resort, longer than any task")

    @model_validator(mode="after")
    def _timeouts(self) -> "Settings":
        longest = max(self.control_time_limit_s, self.profile_time_limit_s, self.training_time_limit_s)
        if self.visibility_timeout_s <= longest:
            raise ValueError(
                f"visibility_timeout_s={self.visibility_timeout_s} must be longer than the longest task time limit "
                f"({longest} s), or the broker redelivers tasks that are still running"
            )
        if self.lease_ttl_s <= self.heartbeat_s:
            raise ValueError(f"lease_ttl_s={self.lease_ttl_s} must be longer than heartbeat_s={self.heartbeat_s} (leases renew at that period)")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, from the environment (read once)."""
    return Settings()

"""Settings from the environment (EDGETRAIN_*), or given explicitly by an entry point."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .keys import DEFAULT_PREFIX


class Settings(BaseSettings):
    """What every edgetrain process is configured with; `EDGETRAIN_<NAME>` sets <name>."""

    model_config = SettingsConfigDict(env_prefix="EDGETRAIN_")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="redis://, rediss:// or unix:// URL")
    key_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9_.-]+$", description="prefix of edgetrain's Redis keys")
    artifact_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "artifacts")
    data_dir: Path = Field(Path.home() / ".cache" / "edgetrain" / "data")
    heartbeat_s: float = Field(5.0, gt=0, description="fleet heartbeat period (s)")
    heartbeat_ttl_s: float = Field(30.0, gt=0, description="a device is gone after this long without a heartbeat (s)")
    visibility_timeout_s: int = Field(6 * 3600, gt=0, description="broker redelivery timeout (s); longer than any task")
    task_max_retries: int = Field(3, ge=0, description="redeliveries of a task whose worker died")
    torch_threads: int = Field(0, ge=0, description="torch threads per worker process; 0 = torch's default")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, from the environment (read once)."""
    return Settings()

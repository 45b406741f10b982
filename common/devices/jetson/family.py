"""The board family of a Jetson ("jetson-nano", "jetson-orin-nano", ...) from its GPU
devfreq node (the SoC), its device-tree model and, failing that, its rail names."""

from __future__ import annotations

from pathlib import Path

from .sysfs import Rail, SysfsIO, read_model

# The SoC by devfreq entry name; the family comes from the device-tree model where it names
# one of that SoC's boards, else from a rail only that family has (exact names:
# VDD_CPU_GPU_CV must not count as VDD_CPU_GPU).
SOC_BY_DEVFREQ = {
    "57000000.gpu": "t210",
    "17000000.gp10b": "t186",
    "17000000.gv11b": "t194",
    "17000000.ga10b": "t234",
    "17000000.gpu": "t234",
    "gpu-gpc-0": "t264",
}
FAMILY_BY_MODEL = (  # (SoC, substring of the lower-cased model, family), most specific first
    ("t210", "tx1", "jetson-tx1"),
    ("t210", "nano", "jetson-nano"),
    ("t186", "tx2 nx", "jetson-tx2-nx"),
    ("t186", "tx2", "jetson-tx2"),
    ("t194", "xavier nx", "jetson-xavier-nx"),
    ("t194", "agx xavier", "jetson-agx-xavier"),
    ("t194", "jetson-agx", "jetson-agx-xavier"),
    ("t194", "jetson-xavier", "jetson-agx-xavier"),
    ("t234", "orin nano", "jetson-orin-nano"),
    ("t234", "orin nx", "jetson-orin-nx"),
    ("t234", "agx orin", "jetson-agx-orin"),
    ("t264", "thor", "jetson-thor"),
)
FAMILY_BY_RAIL = (  # (SoC, rail or None for any, family), first match wins
    ("t210", None, "jetson-nano"),
    ("t186", "VDD_CPU_GPU", "jetson-tx2-nx"),
    ("t186", None, "jetson-tx2"),
    ("t194", "VDD_CPU_GPU_CV", "jetson-xavier-nx"),
    ("t194", None, "jetson-agx-xavier"),
    ("t234", "VDD_GPU_SOC", "jetson-agx-orin"),
    ("t234", None, "jetson-orin"),  # Orin Nano and Orin NX share rails: only the model tells them apart
    ("t264", None, "jetson-thor"),
)


def board_family(root: Path, devfreq: Path, rails: list[Rail], io: SysfsIO) -> str:
    """A stable board family name such as "jetson-nano", from the GPU's devfreq node (the
    SoC), then the device-tree model or, failing that, the rail names."""
    soc = SOC_BY_DEVFREQ.get(devfreq.name)
    model = (read_model(root, io) or "").lower()
    for family_soc, needle, family in FAMILY_BY_MODEL:
        if needle in model and soc in (family_soc, None):
            return family
    names = {r.name for r in rails}
    for family_soc, rail, family in FAMILY_BY_RAIL:
        if soc == family_soc and (rail is None or rail in names):
            return family
    return "jetson"

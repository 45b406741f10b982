"""What a job spec or a task may name on the fleet, checked without importing or reading it.

- Models: a registered name, or `package.module:factory` from a module the operator allows on
  the workers (`EDGETRAIN_ALLOWED_MODEL_MODULES`); never a standard-library module.
- Weights: `init:<seed>`, or an artifact of the store by name,
  `artifact:<file name>#sha256=<64 hex digits>`, resolved inside `EDGETRAIN_ARTIFACT_DIR`.
- Data: `dataset.path` relative to the data roots (`EDGETRAIN_DATA_ROOTS`, default
  `EDGETRAIN_DATA_DIR`), without `..`; a worker resolves it (symbolic links included) and
  refuses anything that lands outside the roots, then checks every file and folder it opens
  there again, by what it opened (`open_inside`), so a folder swapped for a link between the
  check and the read is refused.

The checks on the form (`*_problem`) need no configuration and run on the client; the
resolving ones (`confine`, `data_path`, `artifact_path`, `open_inside`) run where the file is
read.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

USER_MODEL = re.compile(r"(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?P<factory>[A-Za-z][A-Za-z0-9_]*)")
INIT_WEIGHTS = re.compile(r"init:(?P<seed>[0-9]{1,10})")
ARTIFACT_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}"
ARTIFACT_URL = re.compile(rf"artifact:(?P<name>{ARTIFACT_NAME})#sha256=(?P<sha256>[0-9a-f]{{64}})")
WEIGHTS_FORMS = "'init:<integer seed>' or 'artifact:<name>#sha256=<64 hex digits>' (the URL pretrain returns)"


class RefusedError(ValueError):
    """A request names code or a file it may not; the message names the field and what is allowed."""


# --------------------------------------------------------------------------- models


def module_allowed(module: str, allowed: Sequence[str]) -> bool:
    """Whether `module` is one of `allowed` or inside one of them (a package and its submodules)."""
    return any(module == a or module.startswith(a + ".") for a in allowed)


def user_model_problem(name: str, allowed: Sequence[str] | None) -> str | None:
    """Why `name` may not be imported as `package.module:factory`, or None. `allowed` None:
    the allow-list is not known here (a client), so only the form is checked."""
    match = USER_MODEL.fullmatch(name)
    if match is None:
        return f"{name!r} is neither a registered model nor 'package.module:factory' (letters, digits, '_' and '.')"
    module = match["module"]
    if module.split(".")[0] in sys.stdlib_module_names:
        return f"{name!r}: the standard library ({module.split('.')[0]!r}) holds no models"
    if allowed is not None and not module_allowed(module, allowed):
        listed = ", ".join(allowed) if allowed else "none"
        return f"{name!r}: module {module!r} is not allowed here (EDGETRAIN_ALLOWED_MODEL_MODULES: {listed})"
    return None


def split_user_model(name: str) -> tuple[str, str]:
    """(module, factory) of a `package.module:factory` name that passed `user_model_problem`."""
    match = USER_MODEL.fullmatch(name)
    assert match is not None, name
    return match["module"], match["factory"]


# --------------------------------------------------------------------------- weights


def artifact_url(file_name: str, sha256: str) -> str:
    """The reference of an artifact stored as `file_name` with content hash `sha256`."""
    url = f"artifact:{file_name}#sha256={sha256}"
    if ARTIFACT_URL.fullmatch(url) is None:
        raise ValueError(f"not an artifact file name: {file_name!r}")
    return url


def safe_file_name(name: str) -> str:
    """`name` with every character outside letters, digits, '_', '.' and '-' made '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".-_") or "artifact"


def weights_problem(weights: str) -> str | None:
    """Why `weights` is neither `init:<seed>` nor an artifact reference, or None."""
    if INIT_WEIGHTS.fullmatch(weights) or ARTIFACT_URL.fullmatch(weights):
        return None
    return f"{weights[:100]!r} is not {WEIGHTS_FORMS}; files outside the artifact store are never read"


def init_seed(weights: str) -> int | None:
    """The seed of `init:<seed>` weights, or None for an artifact reference."""
    match = INIT_WEIGHTS.fullmatch(weights)
    return int(match["seed"]) if match else None


def artifact_path(weights: str, store: Path) -> tuple[Path, str]:
    """(the file inside `store`, its expected sha256) of an artifact reference; RefusedError
    for any other form or a file that resolves outside the store (a symbolic link out of it)."""
    match = ARTIFACT_URL.fullmatch(weights)
    if match is None:
        raise RefusedError(f"weights: {weights_problem(weights)}")
    path = confine(store / match["name"], [store], "weights", "the artifact store (EDGETRAIN_ARTIFACT_DIR)")
    return path, match["sha256"]


# --------------------------------------------------------------------------- data paths


def data_path_problem(path: str) -> str | None:
    """Why a spec's dataset.path is not a plain path relative to the data roots, or None."""
    if "\x00" in path:
        return "contains a NUL character"
    pure = PurePosixPath(path)
    if ".." in pure.parts:
        return f"{path!r} contains '..'; give a path inside the workers' data roots (EDGETRAIN_DATA_ROOTS)"
    if pure.is_absolute() or path.startswith("~"):
        return f"{path!r} is absolute; give a path relative to the workers' data roots (EDGETRAIN_DATA_ROOTS)"
    return None


DATA_ROOTS = "the data roots (EDGETRAIN_DATA_ROOTS, default EDGETRAIN_DATA_DIR)"
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK  # a FIFO or device never blocks the open


def _inside(path: str | Path, roots: Sequence[Path]) -> bool:
    return any(Path(path).is_relative_to(os.path.realpath(root)) for root in roots)


def confine(path: Path, roots: Sequence[Path], field: str, where: str) -> Path:
    """`path` with symbolic links resolved, if it lies inside one of `roots` (resolved too);
    RefusedError naming `field` otherwise. The path need not exist. It is checked by name:
    read it with `open_inside`, which checks what was opened."""
    resolved = Path(os.path.realpath(path))
    if _inside(resolved, roots):
        return resolved
    raise RefusedError(f"{field}: {str(path)!r} is outside {where}: {[str(r) for r in roots]}")


def opened_path(fd: int) -> str:
    """The real path of the file open at `fd`, as the kernel knows it (Linux: /proc/self/fd)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def open_inside(path: Path, roots: Sequence[Path], folder: bool = False, field: str = "dataset.path", where: str = DATA_ROOTS) -> int:
    """A file descriptor of `path`, a regular file (or, with `folder`, a folder), checked twice:
    its path (links resolved) before it is opened, and the file the kernel opened, by its real
    path and type, before anything is read from it. RefusedError naming `field` when either lies
    outside `roots`: a folder swapped for a link after the first check is refused, not read."""
    resolved = confine(path, roots, field, where)
    fd = os.open(resolved, READ_FLAGS | (os.O_DIRECTORY if folder else 0))
    try:
        if not _inside(opened_path(fd), roots):
            raise RefusedError(f"{field}: {str(path)!r} is outside {where}: {[str(r) for r in roots]} (it changed after it was checked)")
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
            raise RefusedError(f"{field}: {str(path)!r} is not a {'folder' if folder else 'regular file'}")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def data_path(path: str, roots: Sequence[Path]) -> Path:
    """A dataset.path resolved inside the data roots: a relative one under the first root where
    it exists (else the first root), an absolute one only when it lies inside a root. Checked by
    name: read what it names with `open_inside`."""
    if "\x00" in path or ".." in PurePosixPath(path).parts:
        raise RefusedError(f"dataset.path: {data_path_problem(path)}")
    if Path(path).is_absolute():
        return confine(Path(path), roots, "dataset.path", DATA_ROOTS)
    candidates = [Path(root) / path for root in roots]
    found = next((c for c in candidates if c.exists()), candidates[0])
    return confine(found, roots, "dataset.path", DATA_ROOTS)

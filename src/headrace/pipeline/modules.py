"""A module's identity by content, for the fingerprint of a step that calls into it.

A step that calls ``mylib.decode`` ran other code once ``mylib.py`` was edited, but counted the
module by its name: a shared Redis cache served the old code's samples. A module with a Python
source file now counts by a hash of that file's bytes (the same in every process and on every
host holding the same file); one without (built-in, frozen, an extension, a namespace package)
by its name and its package's ``__version__``, if it has one.

The file is read once per module as loaded in this process: the digest is kept with the
module's ``__spec__`` (an import, or an ``importlib.reload``, makes a new one), not with the
file's time. A file edited while a job runs does not change that job's fingerprints: the code
it runs is still the one it imported, and entries it writes after the edit must keep the old
code's keys, or a job started after the edit would be served them. (A file edited between the
import and the first fingerprint, seconds apart in a script, is read as edited.)
"""

from __future__ import annotations

import hashlib
import sys
from types import ModuleType
from typing import Any

_READ: dict[str, tuple[Any, str]] = {}
"""Module name -> (the ``__spec__`` (else the module) it was read for, its digest)."""

SCRIPT_NAMES = frozenset({"__main__", "__mp_main__"})
"""The training script's names (in the process that runs it, in a ``spawn`` child)."""


def package_version(name: str) -> str | None:
    """``__version__`` of the top-level package of module ``name``, if it is imported and has
    one (``torch.nn.functional`` -> torch's)."""
    top = sys.modules.get(name.partition(".")[0])
    version = getattr(top, "__version__", None)
    return str(version) if isinstance(version, str) else None


def module_digest(mod: ModuleType) -> str:
    """``name:hash`` of ``mod``'s source file (``.py``), else ``name=version`` or ``name``.

    The training script counts by its name: its steps count their own code, and an edit to the
    script (a learning rate) must not change every step's identity."""
    name = str(getattr(mod, "__name__", "?"))
    if name in SCRIPT_NAMES:
        return "__main__"
    spec = getattr(mod, "__spec__", None)
    origin = getattr(spec, "origin", None) if spec is not None else getattr(mod, "__file__", None)
    token = spec if spec is not None else mod
    if isinstance(origin, str) and origin.endswith(".py"):
        seen = _READ.get(name)
        if seen is not None and seen[0] is token:
            return seen[1]
        try:
            with open(origin, "rb") as f:
                digest = f"{name}:{hashlib.sha256(f.read()).hexdigest()[:12]}"
        except OSError:  # no longer there, or inside an archive: as a module without a file
            pass
        else:
            _READ[name] = (token, digest)
            return digest
    version = package_version(name)
    return f"{name}={version}" if version else name

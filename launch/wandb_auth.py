"""Whether wandb has an API key, found where ``wandb login`` and wandb itself look for one.

Why: kernelrl logs offline unless it can log online, so that a run never stops to ask for a key
(``wandb sync`` uploads an offline run later). Judging that by ``WANDB_API_KEY`` alone kept
every run offline after ``wandb login``, which stores the key in the netrc file. A key counts
here wherever wandb would use it: the environment (``WANDB_API_KEY``, an identity token file),
the netrc file (``$NETRC`` or ``~/.netrc``) for the wandb host (``$WANDB_BASE_URL``, default
api.wandb.ai), or an ``api_key`` in wandb's settings files. Read without importing wandb and
without the network.
"""

from __future__ import annotations

import configparser
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["default_wandb_mode", "wandb_key_found"]

DEFAULT_BASE_URL = "https://api.wandb.ai"


def _netrc_key(environ: Mapping[str, str], home: Path) -> bool:
    host = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).hostname or ""
    candidates = [Path(environ["NETRC"])] if environ.get("NETRC") else []
    candidates += [home / ".netrc", home / "_netrc"]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            found = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue
        if found and found[2]:
            return True
    return False


def _settings_key(environ: Mapping[str, str], home: Path) -> bool:
    config_dir = Path(environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb")
    for path in (config_dir / "settings", Path("wandb") / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        if any(parser.get(s, "api_key", fallback="") for s in parser.sections()):
            return True
    return False


def wandb_key_found(environ: Mapping[str, str] | None = None, home: Path | None = None) -> bool:
    """True when wandb would find credentials without asking for them."""
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    return _netrc_key(environ, home) or _settings_key(environ, home)


def default_wandb_mode() -> str:
    """Set ``WANDB_MODE=offline`` when no key is found and the user chose no mode; returns the
    mode the run will use."""
    if not wandb_key_found():
        os.environ.setdefault("WANDB_MODE", "offline")
    return os.environ.get("WANDB_MODE", "online")

"""A model named by its Hugging Face hub id: usable before anything starts, or one line why not.

Why: with the hub off (``HF_HUB_OFFLINE=1``) or out of reach, transformers ends a run with a
fifty-line traceback ("pass local_files_only=False") after the recipe, the data and the
environment pool were set up. ``ensure_hub_model`` asks first, for the one file every loader
reads (``config.json``): found in the local cache, or fetched now when the user's environment
allows the hub; otherwise a ``UserError`` that says what to set. transformers and vLLM then
fetch the weights themselves, into the same cache.

kernelrl turns the hub off only for its bundled model (``launch.models``: a local folder that
never needs it); a user's ``HF_HUB_OFFLINE`` is theirs, and a recipe's ``env:`` no longer
overrides it (``launch.recipe.keep_user_environment``).
"""

from __future__ import annotations

import os

from kernelrl.launch.errors import UserError

__all__ = ["ensure_hub_model", "hub_offline"]

_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """Whether the user's environment turns the hub off (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the cache layout cannot hold: not cached
        return False


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)


def ensure_hub_model(repo_id: str) -> str:
    """``repo_id`` when its config is in the local cache or could be fetched now; else one
    line (``UserError``) naming the cause and the fix."""
    if _cached(repo_id):
        return repo_id
    if hub_offline():
        raise UserError(
            f"model {repo_id!r} is not in the local Hugging Face cache and "
            f"HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']} keeps the hub off: unset it (or set "
            "HF_HUB_OFFLINE=0) to download the model, or give a local model folder"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        hf_hub_download(repo_id, "config.json")
    except GatedRepoError:
        raise UserError(
            f"model {repo_id!r} is gated on the hub: accept its terms on huggingface.co, then "
            "log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise UserError(
            f"no model {repo_id!r} on the hub (a private one needs `hf auth login` or HF_TOKEN)"
        ) from None
    except OfflineModeIsEnabled:
        raise UserError(
            f"model {repo_id!r} is not in the local Hugging Face cache and the hub was turned "
            "off before kernelrl started (HF_HUB_OFFLINE): unset it to download the model"
        ) from None
    except Exception as exc:  # network, proxy, endpoint: httpx and OSError types alike
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        raise UserError(
            f"cannot fetch model {repo_id!r} from {endpoint} ({_first_line(exc)}): check the "
            "network or HF_ENDPOINT, or give a local model folder"
        ) from None
    return repo_id

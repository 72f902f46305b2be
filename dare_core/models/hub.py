"""Hugging Face Hub checkpoints: ``model.path=owner/name`` (or ``...@revision``),
the way every Hugging Face tool names a checkpoint, resolved to a local snapshot directory once,
by config resolution, through ``huggingface_hub``.

``HF_HOME`` / ``HF_HUB_CACHE`` choose the cache and ``HF_HUB_OFFLINE=1`` reads it without the
network, as for every Hugging Face tool. The ranks of a node may resolve at the same time:
``huggingface_hub`` locks each file of the cache while it downloads it, so the node downloads
it once and the other ranks read the finished files. A directory that exists always wins over
a hub id of the same spelling.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from dare_core.errors import DareError

#: ``owner/name`` or ``owner/name@revision`` (a branch, a tag or a commit)
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def local_checkpoint(path: Optional[str], key: str = "model.path") -> Optional[str]:
    """``path`` as a local directory: itself, or the snapshot of the hub repository it names
    (downloaded into the cache unless there already, or offline).

    Args:
        path: a directory, a hub id (``owner/name[@revision]``) or ``None``.
        key: the config key that gave it, for the messages.

    Returns:
        The directory (``None`` stays ``None``).

    Raises:
        DareError: a hub id that cannot be resolved (offline and not cached, unknown, gated).
    """
    match = HUB_ID.match(path) if path is not None and not os.path.exists(path) else None
    if match is None:  # a directory (or what preflight refuses as none)
        return path
    repo, revision = match.group("repo"), match.group("revision")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        return snapshot_download(repo, revision=revision, local_files_only=offline)
    except LocalEntryNotFoundError:
        where = "HF_HUB_OFFLINE=1" if offline else "no network"
        raise DareError(
            f"{key}={path}: not a directory, and the hub checkpoint {repo!r}"
            + (f" at revision {revision!r}" if revision else "")
            + f" is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) with {where}; download it where there "
            f"is a network (huggingface-cli download {repo}) or give a checkpoint directory"
        ) from None
    except RepositoryNotFoundError:
        raise DareError(
            f"{key}={path}: no such directory, and no hub repository {repo!r} (or it is gated: "
            "log in with huggingface-cli login); give a checkpoint directory or a hub id"
        ) from None
    except HfHubHTTPError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DareError(f"{key}={path}: the hub refused the download ({first}); check the id and revision") from None

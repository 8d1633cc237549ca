"""Where a checkpoint is: one named by its path, or a root's latest complete one, with its
manifest. Needs no torch: the launcher checks ``--resume PATH`` with it before any worker starts."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CheckpointError
from .layout import MANIFEST, Manifest, checkpoint_name, step_of
from .storage import Storage


@dataclass(frozen=True)
class Found:
    """A complete checkpoint and its manifest."""

    storage: Storage
    step: int
    manifest: Manifest

    @property
    def url(self) -> str:
        return self.storage.url_of(checkpoint_name(self.step))


def find(path: str, *, missing_ok: bool = False) -> Found | None:
    """``path`` is one checkpoint (``.../step-00000120``) or a root (its latest complete one).
    With ``missing_ok`` a root holding no complete checkpoint gives None (a fresh start)."""
    storage = Storage(path)
    if storage.exists(MANIFEST):
        parent, _, name = storage.url.rpartition("/")
        step = step_of(name)
        if step is None or not parent:
            raise CheckpointError(
                f"{path} holds a manifest but is not named step-NNNNNNNN; pass its parent "
                "directory (the checkpoint root) or the checkpoint as written"
            )
        storage = Storage(parent)
        if not storage.is_complete(step):
            raise CheckpointError(
                f"the checkpoint {path} is incomplete (a writer died or failed before it was "
                f"complete); resume from the root {parent} (its latest complete checkpoint)"
            )
    else:
        listing = storage.listing()
        if listing.latest is None:
            if missing_ok:
                return None
            what = (
                f"only incomplete ones (steps {', '.join(map(str, listing.incomplete))})"
                if listing.incomplete
                else "none"
                if storage.fs.exists(storage.root)
                else "the path does not exist"
            )
            raise CheckpointError(
                f"no complete checkpoint in {path}: {what}; check the path "
                "(--resume auto starts fresh where there is none)"
            )
        step = listing.latest
    try:
        manifest = Manifest.from_json(storage.read_json(f"{checkpoint_name(step)}/{MANIFEST}"))
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(
            f"the manifest of {storage.url_of(checkpoint_name(step))} is damaged ({exc})"
        ) from None
    return Found(storage, step, manifest)

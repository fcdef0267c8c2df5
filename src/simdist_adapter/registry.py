"""Every deployed model version, kept with its metrics; the planner loads `<root>/deployed`.

Layout:
    <root>/versions/v0000/   a checkpoint directory (the pretrained model), v0001, ... adapted ones
    <root>/deployed          symlink to the deployed version, replaced atomically (rename(2))
    <root>/history.json      the deployment stack, newest last, with each version's metrics

Deploy = write the checkpoint (atomic), then swap the symlink; rollback = pop the stack and swap
back. A planner that reloads `<root>/deployed` therefore never sees a half-written model.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
import uuid

from simdist_planner.model.checkpoint import load_checkpoint, save_checkpoint
from simdist_planner.model.world_model import WorldModel


class RegistryError(RuntimeError):
    pass


class ModelRegistry:
    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root)
        self.versions = self.root / "versions"
        self.link = self.root / "deployed"
        self._history_file = self.root / "history.json"

    # -- state
    def history(self) -> list[dict]:
        """Deployment stack, oldest first: [{"version", "path", "metrics", "time"}, ...]."""
        if not self._history_file.exists():
            return []
        return json.loads(self._history_file.read_text())

    @property
    def deployed_version(self) -> str | None:
        h = self.history()
        return h[-1]["version"] if h else None

    def deployed_path(self) -> pathlib.Path:
        if not self.link.exists():
            raise RegistryError(f"{self.root}: nothing deployed yet (call init_from / deploy)")
        return self.link

    def load_deployed(self, device="cpu") -> WorldModel:
        return load_checkpoint(self.deployed_path(), device=device)

    # -- changes
    def init_from(self, checkpoint: str | os.PathLike, metrics: dict | None = None) -> pathlib.Path:
        """Start a registry from a pretrained checkpoint (validated by loading it) as v0000."""
        if self.history():
            raise RegistryError(f"{self.root} already holds {len(self.history())} version(s)")
        return self.deploy(
            load_checkpoint(checkpoint), {"source": str(checkpoint), **(metrics or {})}
        )

    def deploy(self, model: WorldModel, metrics: dict) -> pathlib.Path:
        """Store `model` as the next version and make it the deployed one."""
        history = self.history()
        version = f"v{len(list(self.versions.glob('v*'))) if self.versions.exists() else 0:04d}"
        path = save_checkpoint(model, self.versions / version, metrics=metrics)
        history.append(
            {"version": version, "path": str(path), "metrics": metrics, "time": time.time()}
        )
        self._point_to(path)
        self._write_history(history)
        return path

    def rollback(self) -> str:
        """Re-deploy the previous version (its exact weights); returns the version now deployed."""
        history = self.history()
        if len(history) < 2:
            raise RegistryError("nothing to roll back to: only the first version was ever deployed")
        history.pop()
        self._point_to(pathlib.Path(history[-1]["path"]))
        self._write_history(history)
        return history[-1]["version"]

    def _point_to(self, target: pathlib.Path) -> None:
        tmp = self.root / f".deployed-{uuid.uuid4().hex[:8]}"
        os.symlink(target.resolve(), tmp)
        os.replace(tmp, self.link)

    def _write_history(self, history: list[dict]) -> None:
        tmp = self._history_file.with_suffix(f".tmp-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(history, indent=1))
        os.replace(tmp, self._history_file)

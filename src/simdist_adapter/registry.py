"""Every deployed model version, kept with its metrics; the planner loads `<root>/deployed`.

Layout:
    <root>/versions/v0000/   a checkpoint directory (the pretrained model), v0001, ... adapted ones
    <root>/deployed          symlink to the deployed version, replaced atomically (rename(2))
    <root>/history.json      the deployment stack, newest last, with each version's metrics

Deploy = write the checkpoint (atomic), then swap the symlink; rollback = pop the stack and swap
back. A planner that reloads `<root>/deployed` therefore never sees a half-written model. Paths
in history.json and the link are relative to the root, so a registry can be moved or copied.

`save_delta` / `load_delta` keep a version as the bits in which its tensors differ from the
pretrained checkpoint's (XOR of the raw bits, exact): a record of an adapted model that a
repository can hold without a copy of the pretrained weights, and from which the version is
rebuilt bit for bit beside those weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import time
import uuid

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from simdist_planner.model.checkpoint import load_checkpoint, save_checkpoint, weight_tensors
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
        """The deployment stack.

        Returns:
            [{"version", "path", "metrics", "time"}, ...], oldest first; [] before the first.
        """
        if not self._history_file.exists():
            return []
        return json.loads(self._history_file.read_text())

    @property
    def deployed_version(self) -> str | None:
        h = self.history()
        return h[-1]["version"] if h else None

    def version_path(self, version: str) -> pathlib.Path:
        """The checkpoint directory of a version, whether deployed or not.

        Args:
            version: e.g. "v0003".

        Returns:
            Its path under `versions/`.
        """
        return self.versions / version

    def deployed_path(self) -> pathlib.Path:
        """The deployed checkpoint.

        Returns:
            The `deployed` link; RegistryError when nothing is deployed yet.
        """
        if not self.link.exists():
            raise RegistryError(f"{self.root}: nothing deployed yet (call init_from / deploy)")
        return self.link

    def load_deployed(self, device="cpu") -> WorldModel:
        """Load the deployed model.

        Args:
            device: the torch device to load onto.

        Returns:
            The WorldModel; RegistryError when nothing is deployed yet.
        """
        return load_checkpoint(self.deployed_path(), device=device)

    # -- changes
    def init_from(self, checkpoint: str | os.PathLike, metrics: dict | None = None) -> pathlib.Path:
        """Start a registry from a pretrained checkpoint (validated by loading it) as v0000.

        Args:
            checkpoint: the pretrained checkpoint directory.
            metrics: further metadata to keep with the version, or None.

        Returns:
            The version's path; RegistryError when the registry holds versions already.
        """
        if self.history():
            raise RegistryError(f"{self.root} already holds {len(self.history())} version(s)")
        return self.deploy(
            load_checkpoint(checkpoint), {"source": str(checkpoint), **(metrics or {})}
        )

    def deploy(self, model: WorldModel, metrics: dict, version: str | None = None) -> pathlib.Path:
        """Store a model as the next version and make it the deployed one.

        Args:
            model: the world model.
            metrics: the metadata kept with the version.
            version: its name, for a version rebuilt from its record (one not deployed yet); None:
                the next number.

        Returns:
            The version's checkpoint path; RegistryError for a name deployed already.
        """
        history = self.history()
        if version is None:
            count = len(list(self.versions.glob("v*"))) if self.versions.exists() else 0
            version = f"v{count:04d}"
        elif any(h["version"] == version for h in history):
            raise RegistryError(f"{self.root}: {version} is deployed already")
        path = save_checkpoint(model, self.version_path(version), metrics=metrics)
        relative = str(path.relative_to(self.root))
        history.append(
            {"version": version, "path": relative, "metrics": metrics, "time": time.time()}
        )
        self._point_to(path)
        self._write_history(history)
        return path

    def rollback(self) -> str:
        """Re-deploy the previous version (its exact weights).

        Returns:
            The version now deployed; RegistryError when only the first was ever deployed.
        """
        history = self.history()
        if len(history) < 2:
            raise RegistryError("nothing to roll back to: only the first version was ever deployed")
        history.pop()
        self._point_to(self.root / history[-1]["path"])  # relative, or absolute (older files)
        self._write_history(history)
        return history[-1]["version"]

    def _point_to(self, target: pathlib.Path) -> None:
        tmp = self.root / f".deployed-{uuid.uuid4().hex[:8]}"
        os.symlink(os.path.relpath(target.resolve(), self.root.resolve()), tmp)
        os.replace(tmp, self.link)

    def _write_history(self, history: list[dict]) -> None:
        tmp = self._history_file.with_suffix(f".tmp-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(history, indent=1))
        os.replace(tmp, self._history_file)


def save_delta(
    checkpoint: str | os.PathLike, base: str | os.PathLike, file: str | os.PathLike
) -> int:
    """Write the tensors of a checkpoint that differ from a base's as the XOR of their raw bits
    (safetensors, written atomically). The two must share the model config and the observation
    scaler (an adapted version of the base).

    Args:
        checkpoint: the adapted checkpoint.
        base: the pretrained checkpoint it was adapted from.
        file: the delta file written.

    Returns:
        How many tensors differ.
    """
    model, pretrained = load_checkpoint(checkpoint), load_checkpoint(base)
    _same_frame(model, pretrained, checkpoint, base)
    mine, theirs = weight_tensors(model), weight_tensors(pretrained)
    delta = {
        name: _bits(tensor) ^ _bits(theirs[name])
        for name, tensor in mine.items()
        if not torch.equal(_bits(tensor), _bits(theirs[name]))
    }
    file = pathlib.Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}")
    save_file(delta, str(tmp), metadata={"base_weights": _weights_sha(theirs)})
    os.replace(tmp, file)
    return len(delta)


def load_delta(base: str | os.PathLike, file: str | os.PathLike) -> WorldModel:
    """The model `save_delta` recorded, rebuilt bit for bit on the base's weights.

    Args:
        base: the pretrained checkpoint.
        file: the delta file.

    Returns:
        The WorldModel; RegistryError when the delta was recorded against other weights or names
        a tensor the model lacks.
    """
    model = load_checkpoint(base)
    tensors = weight_tensors(model)
    with safe_open(str(file), "pt") as f:
        expected = (f.metadata() or {}).get("base_weights")
        if expected != _weights_sha(tensors):
            raise RegistryError(
                f"{file}: recorded against other pretrained weights than {base} "
                f"(base sha256 {expected}, given {_weights_sha(tensors)})"
            )
        for name in f.keys():
            if name not in tensors:
                raise RegistryError(f"{file}: tensor {name} is not in the model of {base}")
            bits = f.get_tensor(name) ^ _bits(tensors[name])
            tensors[name] = bits.view(tensors[name].dtype)
    model.load_state_dict(tensors, strict=False)  # the scaler's buffers stay the base's
    return model


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits as integers of its width (XOR is exact on them)."""
    return tensor.contiguous().view(
        {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[tensor.element_size()]
    )


def _weights_sha(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _same_frame(model: WorldModel, base: WorldModel, where, base_where) -> None:
    if model.config != base.config or model.scaler.to_dict() != base.scaler.to_dict():
        raise RegistryError(
            f"{where} is not an adapted version of {base_where}: the model config or the "
            "observation scaler differ (save_delta keeps tensors only)"
        )

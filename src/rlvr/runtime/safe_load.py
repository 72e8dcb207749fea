"""Loading a checkpoint's pickled parts without running code from them.

A checkpoint may come from anyone (a colleague's run, a bucket), and a pickle can call any
function it names. So nothing here unpickles with the standard loader:
1. the trainer state goes through `torch.load(weights_only=True)`: tensors, numbers, strings,
   containers, plus `TRAINER_STATE_GLOBALS` (NumPy's array rebuild, for the NumPy RNG state) and
   the data classes the caller names (the replay buffer's groups);
2. the optimizer shards of sharded learners (`torch.distributed.checkpoint`) are read with
   `SafeReader`, whose `.metadata` goes through an unpickler that knows only DCP's metadata
   classes (`DCP_METADATA_GLOBALS`), and `SafePlanner`, which loads the non-tensor entries
   (Adam's step, the param groups) with `weights_only=True` where DCP's own uses the full pickle.
Anything else a file names is refused with one line (`UntrustedPickle`) naming the file, what it
asked for and `--trust-pickle`, the opt-in for a run folder the user made with an older rlvr or
otherwise trusts: with it, the files load with the full pickle, as code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from rlvr.errors import ConfigError
from rlvr.safe_io import refused_global

TRUST_FLAG = "--trust-pickle"
TRAINER_STATE_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]
DCP_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict")}


class UntrustedPickle(ConfigError):
    """A checkpoint file that names Python objects beyond the allowed data classes."""


def refusal(path: Path, asked: str) -> UntrustedPickle:
    return UntrustedPickle(
        f"'{path}' asks to load {asked}, which could run code; rlvr loads only tensors, numbers and its own "
        f"data classes from a run folder. If you made this run (an older rlvr) or trust every file in it, "
        f"resume with {TRUST_FLAG}")


def load_trainer_state(path: Path, *, data_classes=(), trust_pickle: bool = False) -> dict:
    """The trainer state at `path`; `UntrustedPickle` when it names anything beyond the allow-list
    and `data_classes` (plain data: rebuilt from their fields, no code of theirs runs)."""
    if trust_pickle:
        return torch.load(path, weights_only=False)
    try:
        with torch.serialization.safe_globals([*TRAINER_STATE_GLOBALS, *data_classes]):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise refusal(path, refused_global(err)) from None


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        dtype = getattr(torch, name, None) if module == "torch" else None
        if (module, name) in DCP_METADATA_GLOBALS or isinstance(dtype, torch.dtype):
            return super().find_class(module, name)
        raise refusal(self.path, f"the Python object '{module}.{name}'")


def safe_reader(folder: Path):
    """A `FileSystemReader` of `folder` whose metadata is unpickled with the allow-list only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            path = Path(self._get_metadata_path(kwargs.get("rank")))
            with self.fs.create_stream(path, "rb") as stream:
                metadata = _MetadataUnpickler(stream, path).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def safe_planner(folder: Path):
    """DCP's default load planner, loading the non-tensor entries with `weights_only=True`."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                raise refusal(folder, refused_global(err)) from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafePlanner()


def load_sharded(state: dict, folder: Path, *, trust_pickle: bool = False) -> None:
    """`torch.distributed.checkpoint.load` of `folder` into `state`, its metadata read first with
    the allow-list (a refusal is one line, before DCP starts), its non-tensor entries weights-only."""
    import torch.distributed.checkpoint as dcp

    if trust_pickle:
        dcp.load(state, checkpoint_id=str(folder))
        return
    path = folder / ".metadata"
    with open(path, "rb") as stream:
        _MetadataUnpickler(stream, path).load()
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, checkpoint_id=str(folder), storage_reader=safe_reader(folder), planner=safe_planner(folder))
    except CheckpointException as err:  # what a rank raised, gathered: a refusal on any rank is the one line
        refused = next((e for e, _ in err.failures.values() if isinstance(e, UntrustedPickle)), None)
        if refused is not None:
            raise refused from None
        raise

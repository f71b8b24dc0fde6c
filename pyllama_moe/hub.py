"""``Llama.from_pretrained``: a GGUF from a Hugging Face repository, through huggingface-hub."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path


def _one(files: list[str], pattern: str, repo_id: str) -> str:
    matching = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if len(matching) != 1:
        what = "No file" if not matching else "Multiple files"
        raise ValueError(f"{what} found in {repo_id} matching {pattern}; available files: {files}")
    return matching[0]


def download(repo_id: str, filename: str | None, additional_files: list[str] | None,
             local_dir: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None) -> str:
    """The local path of the repository's file matching ``filename`` (and its additional files)."""
    try:
        from huggingface_hub import HfFileSystem, hf_hub_download
        from huggingface_hub.utils import validate_repo_id
    except ImportError as e:
        raise ImportError("Llama.from_pretrained needs the huggingface-hub package: pip install huggingface-hub") from e
    validate_repo_id(repo_id)
    listing = HfFileSystem().ls(repo_id, recursive=True)
    files = [str(Path(f["name"] if isinstance(f, dict) else f).relative_to(repo_id)) for f in listing]
    main = _one(files, filename or "*.gguf", repo_id)
    for pattern in additional_files or []:
        extra = _one(files, pattern, repo_id)
        hf_hub_download(repo_id=repo_id, filename=Path(extra).name, subfolder=str(Path(extra).parent),
                        local_dir=local_dir, cache_dir=cache_dir)
    return hf_hub_download(repo_id=repo_id, filename=Path(main).name, subfolder=str(Path(main).parent),
                           local_dir=local_dir, cache_dir=cache_dir)

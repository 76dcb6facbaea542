"""Where a search's outputs go: a local folder or any pyarrow.fs URI (s3://, gs://, ...).

Ray Tune writes its experiment folder through pyarrow.fs too, so results.parquet and
best.yaml land beside it on the same storage, reachable from the head node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow.fs as pafs


def is_uri(path: str) -> bool:
    return "://" in path


@dataclass(frozen=True)
class Storage:
    """A folder on a filesystem; `uri` is what Tune is given as storage_path."""

    uri: str

    @classmethod
    def at(cls, storage_path: str) -> "Storage":
        # Tune needs an absolute path; a relative one is relative to where the command runs
        return cls(storage_path if is_uri(storage_path) else os.path.abspath(os.path.expanduser(storage_path)))

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        if is_uri(self.uri):
            return pafs.FileSystem.from_uri(self.uri)
        return pafs.LocalFileSystem(), self.uri

    def join(self, *parts: str) -> str:
        return "/".join([self.uri.rstrip("/"), *parts])

    def exists(self, *parts: str) -> bool:
        fs, base = self._fs()
        return fs.get_file_info("/".join([base.rstrip("/"), *parts])).type != pafs.FileType.NotFound

    def list_dirs(self) -> list[str]:
        fs, base = self._fs()
        if fs.get_file_info(base).type == pafs.FileType.NotFound:
            return []
        return [i.base_name for i in fs.get_file_info(pafs.FileSelector(base)) if i.type == pafs.FileType.Directory]

    def write(self, relative: str, data: bytes) -> str:
        """Write a file under this folder, replacing it whole (a reader never sees half a file)."""
        fs, base = self._fs()
        path = f"{base.rstrip('/')}/{relative}"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        partial = path + ".partial"
        with fs.open_output_stream(partial) as out:
            out.write(data)
        fs.move(partial, path)
        return path

    def read(self, relative: str) -> bytes | None:
        fs, base = self._fs()
        path = f"{base.rstrip('/')}/{relative}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as stream:
            return stream.read()

"""Where a search's outputs go: a local folder or any pyarrow.fs URI (s3://, gs://, ...).

Ray Tune writes its experiment folder through pyarrow.fs too, so results.parquet and
best.yaml land beside it on the same storage, reachable from the head node.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from trainable.errors import ConfigError, problem


def is_uri(path: str) -> bool:
    return "://" in path


# An S3 URI may carry the endpoint of an S3-compatible store in its query, as pyarrow's and Ray's docs show for
# MinIO (`s3://bucket/runs?endpoint_override=host:9000&scheme=http`). hpsearch appends run names and file names
# to the storage path, which a query would end up in the middle of, and Tune and its workers open the same
# store: so the options become the AWS SDK's own environment variables, which pyarrow and boto read in this
# process and the local Ray's workers inherit (a cluster's nodes need them set there), and the query is dropped.
URI_OPTIONS = {"endpoint_override": "AWS_ENDPOINT_URL", "region": "AWS_DEFAULT_REGION", "scheme": None}


def split_query(uri: str) -> tuple[str, dict[str, str]]:
    """A URI without its query, and the query's options."""
    base, _, query = uri.partition("?")
    options = dict(pair.partition("=")[::2] for pair in query.split("&") if pair) if query else {}
    return base, options


def apply_options(options: dict[str, str]) -> None:
    """Set the environment a URI's query asks for (URI_OPTIONS), for this process and the Ray it starts."""
    endpoint = options.get("endpoint_override")
    if endpoint:
        if "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    if options.get("region"):
        os.environ["AWS_DEFAULT_REGION"] = os.environ["AWS_REGION"] = options["region"]


def _write_local(temporary: str, path: str, data: bytes) -> None:
    """Write data to a new file at `temporary` (never an existing one, never through a link), then rename it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    fd = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


class LinkError(PermissionError):
    """A folder inside the storage path is a symbolic link: nothing hpsearch writes leaves the run folder."""


def _refuse_links(base: str, relative_folder: str) -> None:
    """Every folder from the storage path down to the file's must be a real folder, not a link.

    The storage path itself may be a link (./runs -> /data/runs is the user's choice); a run
    folder or its report/ linked elsewhere would have outputs land outside the run folder.
    """
    current = base
    for part in [p for p in relative_folder.split("/") if p]:
        current = f"{current}/{part}"
        if os.path.islink(current):
            raise LinkError(f"{current} is a symbolic link (to {os.readlink(current)}); hpsearch writes nothing "
                            "outside the run folder: replace the link with a folder")


@dataclass(frozen=True)
class Storage:
    """A folder on a filesystem; `uri` is what Tune is given as storage_path."""

    uri: str

    @classmethod
    def at(cls, storage_path: str) -> "Storage":
        # Tune needs an absolute path; a relative one is relative to where the command runs
        if not is_uri(storage_path):
            return cls(os.path.abspath(os.path.expanduser(storage_path)))
        base, options = split_query(storage_path)
        if options and set(options) <= set(URI_OPTIONS):  # others: check_storage refuses them
            apply_options(options)
            return cls(base)
        return cls(storage_path)

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
        """Write a file under this folder, replacing it whole (a reader never sees half a file).

        The bytes go to a new temporary file beside it, `.<name>.<random>.tmp` (a leading dot,
        so dataset readers skip it), created exclusively: a file or symlink planted at that
        name makes the write fail, never writes through it. Then it is moved over the file.
        """
        fs, base = self._fs()
        path = f"{base.rstrip('/')}/{relative}"
        folder, name = path.rsplit("/", 1)
        if isinstance(fs, pafs.LocalFileSystem):
            _refuse_links(base.rstrip("/"), relative.rsplit("/", 1)[0] if "/" in relative else "")
        fs.create_dir(folder, recursive=True)
        temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
        if isinstance(fs, pafs.LocalFileSystem):
            _write_local(temporary, path, data)
            return path
        try:
            with fs.open_output_stream(temporary) as out:
                out.write(data)
            fs.move(temporary, path)
        except BaseException:
            try:
                if fs.get_file_info(temporary).type != pafs.FileType.NotFound:
                    fs.delete_file(temporary)
            except OSError:
                pass
            raise
        return path

    def read(self, relative: str) -> bytes | None:
        fs, base = self._fs()
        path = f"{base.rstrip('/')}/{relative}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as stream:
            return stream.read()


# what the AWS SDK's error says when the store answered but refused the credentials or the bucket
DENIED = ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "INVALID_ACCESS_KEY_ID",
          "SIGNATURE_DOES_NOT_MATCH", "HTTP response code 403")


def check_storage(storage: Storage, min_free_mb: float | None = None) -> None:
    """The storage path is a usable folder (or URI) before anything starts; ConfigError otherwise. A local
    folder must be one this process can make and write in (tried, and undone), on a disk larger than
    `min_free_mb` (experiment.min_free_mb: the disk guard would stop the search at its first step)."""
    key = "experiment.storage_path"
    if is_uri(storage.uri):
        unknown = sorted(set(split_query(storage.uri)[1]) - set(URI_OPTIONS))
        if unknown:
            raise ConfigError([problem(key, f"a storage URI's query may set {', '.join(URI_OPTIONS)} (the AWS "
                                            f"SDK's environment takes the rest: AWS_ACCESS_KEY_ID, ...), not "
                                            f"{', '.join(unknown)}", storage.uri)])
        try:
            fs, path = pafs.FileSystem.from_uri(storage.uri)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as error:
            raise ConfigError([problem(key, f"not a storage URI pyarrow can open ({error}); use a folder, "
                                            "s3://, gs:// or another pyarrow.fs scheme", storage.uri)]) from None
        if isinstance(fs, pafs.LocalFileSystem):  # file://: a folder, checked where it is written
            return
        bucket = path.strip("/").split("/", 1)[0]
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "the store's default endpoint")
        try:
            found = fs.get_file_info(bucket).type != pafs.FileType.NotFound
        except OSError as error:  # unreachable, refused credentials: the SDK's message, its first line
            said = str(error).splitlines()[0][:300]
            if any(word in said for word in DENIED):
                raise ConfigError([problem(key, f"the object store at {endpoint} refused access to bucket "
                                                f"{bucket!r}: check the credentials (AWS_ACCESS_KEY_ID and "
                                                f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and the bucket's policy "
                                                f"({said})", storage.uri)]) from None
            raise ConfigError([problem(key, f"cannot reach the object store at {endpoint} ({said})",
                                       storage.uri)]) from None
        if not found:
            raise ConfigError([problem(key, f"bucket {bucket!r} does not exist at {endpoint}: make it first",
                                       storage.uri)])
        return
    path = storage.uri
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError([problem(key, f"{existing} is a file, not a folder", storage.uri)])
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError([problem(key, f"cannot write in {existing} (permission denied)", storage.uri)])
    try:  # permissions do not tell all (/proc, a read-only mount): make what is missing and write, then undo it
        made = os.path.abspath(path)
        os.makedirs(made, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=made, prefix=".hpsearch-write-test-").close()
        while made != os.path.abspath(existing):
            os.rmdir(made)
            made = os.path.dirname(made)
    except OSError as error:
        raise ConfigError([problem(key, f"cannot make a folder and write in it there ({error.strerror or error})",
                                   storage.uri)]) from None
    total_mb = shutil.disk_usage(existing).total / 2**20
    if min_free_mb is not None and min_free_mb >= total_mb:
        raise ConfigError([problem("experiment.min_free_mb", f"must be below the size of the disk the run folder "
                                   f"is on ({total_mb:,.0f} MB at {existing}): the search stops as soon as less "
                                   "than it is free", min_free_mb)])

"""Type hints of the `hurtle` module (the Python bindings of hurtle; see docs/library.md)."""

import os
from typing import Any, Callable, Dict, Optional, Sequence, Union

_Path = Union[str, "os.PathLike[str]"]

__version__: str

class Error(Exception):
    """A transfer failed; `kind` and `exit_code` say how, as the `hurtle` command would."""

    kind: str
    exit_code: int

class UsageError(Error): ...
class RefusedError(Error): ...
class NetworkError(Error): ...
class VerificationError(Error): ...
class StorageError(Error): ...
class IdentityError(Error): ...
class InterruptedError(Error): ...
class OtherError(Error): ...

def send(
    paths: Union[_Path, Sequence[_Path]],
    *,
    to: Optional[str] = None,
    code: Optional[str] = None,
    relay: Optional[str] = None,
    key: Optional[_Path] = None,
    identity: Optional[_Path] = None,
    known_receivers: Optional[_Path] = None,
    wait: Optional[float] = None,
    channels: Optional[int] = None,
    rate: Union[str, int, None] = None,
    rate_fixed: Union[str, int, None] = None,
    fair: bool = False,
    transport: str = "auto",
    chunk_size: Union[str, int, None] = None,
    payload: Optional[int] = None,
    checksum: bool = False,
    follow_symlinks: bool = False,
    no_sparse: bool = False,
    no_fec: bool = False,
    no_encryption: bool = False,
    cold_start: bool = False,
    relay_only: bool = False,
    include: Union[str, Sequence[str], None] = None,
    exclude: Union[str, Sequence[str], None] = None,
    dry_run: bool = False,
    delete: bool = False,
    log_dir: Optional[_Path] = None,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    progress_interval: float = 0.2,
) -> Dict[str, Any]: ...
def receive(
    out: _Path,
    *,
    listen: Optional[str] = None,
    relay: Optional[str] = None,
    code: Optional[str] = None,
    sender_code: Optional[str] = None,
    keys: Optional[_Path] = None,
    identity: Optional[_Path] = None,
    authorized: Optional[_Path] = None,
    overwrite: bool = False,
    allow_delete: bool = False,
    buffer_memory: Union[str, int, None] = None,
    max_channels: Optional[int] = None,
    no_encryption: bool = False,
    log_dir: Optional[_Path] = None,
    idle_timeout: Optional[float] = None,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ready: Optional[Callable[[str, Optional[str]], Any]] = None,
    progress_interval: float = 0.2,
) -> Dict[str, Any]: ...

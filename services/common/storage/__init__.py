"""A datacenter's storage behind one interface (base.py): POSIX (local disk, CephFS) or HDFS."""

from __future__ import annotations

from ..config import Config
from .base import AbstractVolume
from .posix import PosixVolume


def open_storage(config: Config) -> AbstractVolume:
    """The datacenter's storage as `pfs` names it: the one way pfs and jobs build it.

    `pfs.hdfs` set: HDFS over WebHDFS (storage/hdfs.py); else the POSIX root `pfs.root`.
    """
    if config.pfs.hdfs is not None:
        # HdfsVolume (storage/hdfs.py) plugs in here: return hdfs.HdfsVolume(config.pfs.hdfs, ...).
        raise NotImplementedError("pfs.hdfs: the HDFS volume is not part of this build yet")
    return PosixVolume(config.pfs.root.expanduser().resolve())

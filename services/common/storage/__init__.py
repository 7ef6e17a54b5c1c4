"""A datacenter's storage behind one interface (base.py): POSIX (local disk, CephFS) or HDFS."""

from __future__ import annotations

from ..config import Config
from .base import AbstractVolume
from .hdfs import HdfsVolume
from .posix import PosixVolume


def open_storage(config: Config) -> AbstractVolume:
    """The datacenter's storage as `pfs` names it: the one way pfs and jobs build it.

    `pfs.hdfs` set: HDFS over WebHDFS (storage/hdfs.py); else the POSIX root `pfs.root`.
    """
    if config.pfs.hdfs is not None:
        return HdfsVolume.from_config(config.pfs.hdfs)
    return PosixVolume(config.pfs.root.expanduser().resolve())

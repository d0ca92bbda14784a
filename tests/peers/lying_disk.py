#!/usr/bin/env python3
"""A disk that lies: a FUSE file system with one file, `disk`, backed by a
real file. While `BACKING_FILE.lie` exists, writes are acknowledged and
dropped; otherwise they reach the backing file. Reads return the backing
file's bytes. Mounted with direct_io so nothing is served from the page
cache: what a reader sees is what the "medium" holds.

usage: lying_disk.py BACKING_FILE MOUNTPOINT   (runs in the foreground)
"""
import errno
import os
import stat
import sys

from fuse import FUSE, FuseOSError, Operations


class LyingDisk(Operations):
    def __init__(self, backing):
        self.backing = backing
        self.size = os.path.getsize(backing)
        self.fd = os.open(backing, os.O_RDWR)

    def getattr(self, path, fh=None):
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path == "/disk":
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": self.size}
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", "disk"]

    def open(self, path, flags):
        if path != "/disk":
            raise FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        return os.pread(self.fd, size, offset)

    def write(self, path, data, offset, fh):
        if os.path.exists(self.backing + ".lie"):
            return len(data)  # the lie: acknowledged, never stored
        return os.pwrite(self.fd, data, offset)

    def truncate(self, path, length, fh=None):
        return 0

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        os.fsync(self.fd)
        return 0


if __name__ == "__main__":
    FUSE(LyingDisk(sys.argv[1]), sys.argv[2], foreground=True, direct_io=True, nothreads=True)

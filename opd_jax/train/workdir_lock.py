"""One trainer per workdir: an OS-level lock on workdir/.lock, held for the life of the process.

The lock is `fcntl.flock` on an open file descriptor, so the kernel releases it when the holder exits in any
way, SIGKILL and OOM-kill included. The file itself only records who holds it, as JSON {pid, host, started};
a file left by a killed trainer is stale but unlocked, and the next trainer takes it over and rewrites it.
The file is never deleted (deleting a flock file lets two processes lock two different inodes of one path).

Take the lock before anything writes to the workdir (before the Checkpointer, which deletes leftover orbax
temporary folders on creation). In a multi-process run only process 0 takes it (`enabled=False` elsewhere).

Limits: flock is reliable on local filesystems. On NFS, Linux emulates flock with NFS byte-range locks: it
works across hosts when the server's lock manager runs, fails on acquire (a one-line error here) when none is
available, and with the `nolock` mount option only excludes trainers on the same host. FUSE mounts such as
GCS-fuse keep locks in the local kernel: a second trainer on the same host is stopped, one on another host is
not (it overwrites the holder file, which is then the only trace). A process forked without exec inherits the
descriptor and keeps the lock held until it exits too.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket

from opd_jax.errors import InputError


class WorkdirLock:
  """Context manager: `with WorkdirLock(workdir, enabled=jax.process_index() == 0): train(...)`."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.workdir = workdir
    self.path = os.path.join(workdir, ".lock")
    self.enabled = enabled
    self._fd: int | None = None

  def acquire(self) -> "WorkdirLock":
    """Takes the lock, or raises a one-line InputError naming the trainer that holds it."""
    if not self.enabled or self._fd is not None:
      return self
    if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
      raise InputError(f"workdir {self.workdir!r} is a file; pass a directory as --workdir")
    try:
      os.makedirs(self.workdir, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (O_CLOEXEC)
    except OSError as e:
      raise InputError(f"cannot create {self.path!r} ({e.strerror}); pass a writable --workdir") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = _read_holder(fd)
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise InputError(f"workdir {self.workdir!r} is in use by {holder}; wait for it to finish or use another "
                         "--workdir") from None
      raise InputError(f"cannot lock {self.path!r} ({e.strerror}): the filesystem does not support flock; "
                       "use a --workdir on a local filesystem") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      os.ftruncate(fd, 0)  # no holder recorded once released
    finally:
      os.close(fd)  # closing the last descriptor drops the flock

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read_holder(fd: int) -> str:
  """'pid P on host H (since T)' from the lock file, or a fallback while the holder is still writing it."""
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode())
    return f"pid {info['pid']} on host {info['host']} (since {info['started']})"
  except (OSError, ValueError, KeyError, TypeError):
    return "another process (it has not recorded its pid yet)"


def check_workdir(workdir: str) -> None:
  """The run directory can be created (or is a directory) and written; checked before anything is written."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise InputError(f"--workdir {workdir!r} is a file; give a directory (new or of this run)")
  parent = os.path.abspath(workdir)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise InputError(f"--workdir {workdir!r} is under {parent!r}, which is a file; give a directory path")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise InputError(f"--workdir {workdir!r}: {parent!r} is not writable; give a directory you can write to")

"""This user's caches of what the notebook ships, reused by later runs: the notebook's zips
(`hvd_magic.launch.shipping`) and an executor's unpacked folders (`hvd_magic.task.shipped`).

A folder in a shared temp folder is used only where it is this user's own and private
(`not_private`: owned by this uid, a real folder, nothing for group or others), else anyone on the
host could plant code there that a rank would import. An entry is made once, under an exclusive
lock of its own, into a ``NAME.part-*`` beside it and renamed whole; a process that uses one holds
a shared lock on it while it lives and touches it. `Cache.prune` removes what no process holds:
entries unused for `MAX_AGE_S`, then the least recently used ones unused for a day while the
cache is over `MAX_BYTES`, and the ``.part-*`` that a killed maker left.

Standard library only (an executor's task imports it before anything that was shipped).

Not for: what ships (`hvd_magic.launch.shipping`), or when an executor uses it (`shipped`).
"""

import fcntl
import os
import stat
import time
import uuid

from ..cleanup import remove

MAX_BYTES = 4 * 1024 ** 3     # a cache past this sheds its least recently used entries...
KEEP_S = 24 * 3600            # ...but never one used within a day (a run may still be reading it)
MAX_AGE_S = 14 * 24 * 3600    # an entry unused this long goes whatever the cache's size
PART = ".part-"
LOCK = ".lock"


def not_private(path):
    """Why folder `path` (made 0700 where absent) cannot be trusted with code this user runs,
    in words (who owns it, its mode); None where it is this user's own and private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)  # (not followed: a link to a folder of ours is still someone's link)
    if not stat.S_ISDIR(info.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a file"
        return f"{path} is not a folder but {what}"
    if info.st_uid != os.getuid():
        return f"{path} belongs to {_user(info.st_uid)}, not to this user ({_user(os.getuid())})"
    if info.st_mode & 0o077:
        return (f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}, "
                f"not 0700): what is in it may not be this user's")
    return None


def _user(uid):
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _locked(path, how):
    """An open file holding lock `how` on lock file `path`, the one now at that path (a pruner
    may have removed the file we waited on: then again on the new one)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, how)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BlockingIOError:
            os.close(fd)
            return None
        os.close(fd)


def _size(path):
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    return sum(os.lstat(os.path.join(folder, name)).st_size
               for folder, _, names in os.walk(path) for name in names)


class Cache:
    """Entries (files or folders) in folder `root`, each made once and held while in use."""

    def __init__(self, root, max_bytes=MAX_BYTES, max_age=MAX_AGE_S):
        self.root, self.max_bytes, self.max_age = root, max_bytes, max_age
        self._held = {}  # name: the open lock file this process holds it by

    def use(self, name, make):
        """(The path of entry `name`, whether it was made now): made by `make(part)` (which
        writes the entry at path `part`) where absent, then held by this process and touched."""
        path = os.path.join(self.root, name)
        made = False
        if name not in self._held:
            os.makedirs(self.root, 0o700, exist_ok=True)
            fd = _locked(path + LOCK, fcntl.LOCK_SH)
            if not os.path.exists(path):
                os.close(fd)
                fd, made = self._made(name, path, make)
            self._held[name] = fd
        os.utime(path, follow_symlinks=False)  # (what `prune` orders by)
        return path, made

    def _made(self, name, path, make):
        """(Entry `name`'s lock, shared; whether this process made it): made where no other
        process did meanwhile, under the exclusive lock (one maker among the host's processes)."""
        fd = _locked(path + LOCK, fcntl.LOCK_EX)
        try:
            made = not os.path.exists(path)
            if made:
                self._drop_parts(name)  # (a killed maker's: no one else is making it)
                part = f"{path}{PART}{uuid.uuid4().hex[:8]}"
                try:
                    make(part)
                    os.rename(part, path)  # whole or not at all
                finally:
                    remove(part)
            # (not atomic: a pruner that takes the lock between finds an entry used just now)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)  # (a failed make leaves the next process to make it)
            raise
        return fd, made

    def _drop_parts(self, name):
        for other in os.listdir(self.root):
            if other.startswith(name + PART):
                remove(os.path.join(self.root, other))

    def prune(self, now=None):
        """Remove what no process holds: entries unused for `max_age`, then, the least recently
        used first, those unused for `KEEP_S` while the cache is over `max_bytes`; a killed
        maker's ``.part-*``; lock files of no entry. The names removed."""
        now = time.time() if now is None else now
        names = os.listdir(self.root)
        entries = []
        for name in names:
            path = os.path.join(self.root, name)
            if name.endswith(LOCK) or PART in name:
                continue
            try:
                entries.append((os.lstat(path).st_mtime, _size(path), name))
            except FileNotFoundError:
                continue
        entries.sort(reverse=True)
        total, removed = 0, []
        for mtime, size, name in entries:
            total += size
            unused = now - mtime
            if unused > self.max_age or total > self.max_bytes and unused > KEEP_S:
                if self._remove_unheld(name, entry=True):
                    removed.append(name)
                    total -= size
        # a part a killed maker left, a lock of an entry that is gone
        present = {name for _, _, name in entries} - set(removed)
        others = {name.split(PART)[0] for name in names if PART in name} | \
            {name[:-len(LOCK)] for name in names if name.endswith(LOCK)} - present
        for name in sorted(others):
            self._remove_unheld(name, entry=False)
        return removed

    def _remove_unheld(self, name, entry):
        """Remove entry `name` (or, not `entry`, only its parts and lock where the entry is
        gone) unless a process holds it or makes it; whether it did."""
        if name in self._held:
            return False
        path = os.path.join(self.root, name)
        fd = _locked(path + LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        try:
            if entry:
                remove(path)
            self._drop_parts(name)
            if not os.path.exists(path):
                os.unlink(path + LOCK)  # (under its lock: a waiter then takes the new one)
        finally:
            os.close(fd)
        return True

"""Files netplugin writes: finding the temp files of writes that never finished.

Every writer in netplugin names its temp file after its process, so a temp file whose writer is
dead is garbage nobody will rename: a SIGKILL between create and rename, or a crash, leaves one.
The three shapes (each writer's own):

* ``<containerID>:<ifname>.json.tmp.<pid>.<tid>``: :func:`netplugin.store.fsutil.atomic_write`
  of a CNI attachment record (pod records' temps are the state store's, ``StateStore.scan``).
  The ``:`` matters: an IPAM record is named after an infra id, which may end in
  ``.json.tmp.1.2`` but never contains ``:``, and must never be taken for a temp file;
* ``.<name>.<pid>.<tid>.tmp``: the native bridge's IPAM (``plugins/ipam_files.py``);
* ``.<name>.<pid>.tmp``: the bash bridge's IPAM (``replace_file``).

:func:`stale_temps` lists those under a directory tree whose writer is gone; ``netplugin gc`` and
the CNI shim's GC remove them.
"""

from __future__ import annotations

import os
import re
import stat

__all__ = ["stale_temps", "temp_writer_pids"]

_SHAPES = (
    re.compile(r"[^:]+:[^:]+\.json\.tmp\.(\d+)\.\d+"),
    re.compile(r"\..+\.(\d+)\.\d+\.tmp"),
    re.compile(r"\..+\.(\d+)\.tmp"),
)


def temp_writer_pids(name: str) -> list[int]:
    """The possible writers' pids when ``name`` is one of netplugin's temp file names, else [].

    More than one when the shapes are ambiguous (``.a.5.1234.tmp``: the native IPAM's pid 5, or
    the bash IPAM's pid 1234): the file is stale only when every one of them is dead.
    """
    return [int(m.group(1)) for m in (shape.fullmatch(name) for shape in _SHAPES) if m]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def stale_temps(root: str, *, max_depth: int = 4) -> list[str]:
    """Temp files under ``root`` (at most ``max_depth`` directories down) whose writer is dead.

    Symbolic links are neither followed nor listed; only regular files count. A directory that
    cannot be listed is skipped (gc reports what it removes, not what it could not see).
    """
    found: list[str] = []
    todo = [(root, 0)]
    while todo:
        directory, depth = todo.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if depth < max_depth:
                    todo.append((entry.path, depth + 1))
                continue
            pids = temp_writer_pids(entry.name) if stat.S_ISREG(mode) else []
            if pids and not any(map(_alive, pids)):
                found.append(entry.path)
    return sorted(found)

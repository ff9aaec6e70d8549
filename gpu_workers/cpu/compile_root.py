"""The compiler's view of the host: a mount namespace holding only what a compile needs.

A kernel's source is preprocessed by the compiler, and `__has_include("/any/path")` (or
`__has_include_next`) asks whether a host file exists without ever reading it, so no list
of files read can show it. The compile therefore runs where the host is not: in a mount
namespace of its own (`unshare --mount`), chrooted into an empty tmpfs that holds,
read-only, the compiler's installation and the system headers (`/usr/bin`, `/usr/lib*`,
`/usr/libexec`, `/usr/include`, the top-level links to them, the loader's cache, and the
compiler's own prefix when it lives elsewhere) and, writable, the build's work folder as
`/work`. Any other path is then absent, whatever it is.

`confined(argv, work)` wraps a compiler command line in it. Where this host cannot make
the namespace (not root and no user namespaces, no `unshare` or `chroot`), `unavailable()`
says why, the command runs as before, and the source scan refuses `__has_include` of an
absolute or `..` path (`source_scan.host_path_probes`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

WORK = "/work"
"""Where the build's work folder appears inside the compile's root."""
HOST_PATHS = (
    "/usr/bin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/libexec",
    "/usr/include",
    "/bin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
)
"""What of the host the compiler sees (those that exist), read-only; links are kept as
links."""

_SETUP = r"""
set -e
root="$1"; work="$2"; shift 2
mount -t tmpfs -o mode=0755,size=16m kf-compile "$root"
for path in $KF_HOST_PATHS; do
    [ -e "$path" ] || [ -L "$path" ] || continue
    mkdir -p "$root$(dirname "$path")"
    if [ -L "$path" ]; then ln -s "$(readlink "$path")" "$root$path"; continue; fi
    if [ -d "$path" ]; then mkdir -p "$root$path"; else : > "$root$path"; fi
    mount --rbind "$path" "$root$path"
    mount -o remount,bind,ro "$root$path"
done
mkdir -p "$root/work" "$root/tmp" "$root/dev"
: > "$root/dev/null"
mount --bind /dev/null "$root/dev/null"
mount --bind "$work" "$root/work"
cd "$root"
exec chroot "$root" /bin/sh -c 'cd /work && export TMPDIR=/work HOME=/work && exec "$@"' sh "$@"
"""


def _compiler_prefix(compiler: str) -> str | None:
    """The installation folder of a compiler that does not live under /usr."""
    found = shutil.which(compiler)
    if found is None:
        return None
    real = os.path.realpath(found)
    if real.startswith("/usr/"):
        return None
    return str(Path(real).parent.parent)


def host_paths(compiler: str) -> tuple[str, ...]:
    prefix = _compiler_prefix(compiler)
    return HOST_PATHS + ((prefix,) if prefix else ())


@functools.cache
def unavailable() -> str | None:
    """Why this host cannot confine a compile (None: it can)."""
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"no {tool} on this host"
    probe = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        probe += ["--map-root-user"]
    try:
        done = subprocess.run(
            [*probe, "true"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"no mount namespace for the compiler: {done.stderr.strip()[-300:]}"
    return None


def confined(
    argv: list[str], work: Path, *, compiler: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """`argv` run with `work` as its folder, seeing nothing else of the host but the
    compiler's installation (`compiler`'s, or `argv[0]`'s) and the system headers; and the
    environment it needs. Paths in `argv` must be relative to `work`. Unchanged where
    `unavailable()`."""
    if unavailable() is not None:
        return argv, {}
    root = work / ".root"
    root.mkdir(exist_ok=True)
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare += ["--map-root-user"]
    found = shutil.which(argv[0])  # through any links the root does not hold (alternatives)
    tool = os.path.realpath(found) if found else argv[0]
    wrapped = [*unshare, "/bin/sh", "-c", _SETUP, "sh", str(root), str(work), tool, *argv[1:]]
    return wrapped, {"KF_HOST_PATHS": " ".join(host_paths(compiler or argv[0]))}

"""Offline set-up of the device toolchain: system ARM GCC, newlib, QEMU, and PlatformIO's tool-scons.

PlatformIO runs every build through SCons, which it normally downloads from its registry as the
core package ``tool-scons``. That registry is unreachable here, so :func:`setup` builds the package
from the ``scons`` distribution installed from PyPI (the ``device`` extra): the ``SCons`` package
is copied to ``<core_dir>/packages/tool-scons/`` next to a ``scons.py`` entry, a ``package.json``
and a ``.piopm`` that names owner ``platformio`` and the version PlatformIO requires
(``platformio/dependencies.py``). Everything else (compiler, C library, emulator) comes from Debian.

    python -m tinytrain.device.toolchain setup [--quiet]     # idempotent; exit 1 with a message on failure
    python -m tinytrain.device.toolchain check               # report only, installs nothing
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ToolchainError", "setup", "find_pio", "pio_core_dir", "pio_env", "check_system_tools"]

#: executable / file to look for -> Debian package that provides it
SYSTEM_TOOLS = {
    "arm-none-eabi-gcc": "gcc-arm-none-eabi",
    "qemu-system-arm": "qemu-system-arm",
}
NEWLIB_DIRS = ("/usr/lib/arm-none-eabi/newlib",)
NEWLIB_PACKAGE = "libnewlib-arm-none-eabi"
SCONS_MARKER = "tinytrain"  # written into package.json so we know the package is ours


class ToolchainError(RuntimeError):
    """A tool the device build needs is missing; the message says how to install it."""


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[toolchain] {msg}", file=sys.stderr)


def pio_core_dir() -> Path:
    """PlatformIO's core directory (``$PLATFORMIO_CORE_DIR`` or ``~/.platformio``)."""
    env = os.environ.get("PLATFORMIO_CORE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".platformio"


def pio_env() -> dict[str, str]:
    """Environment for running ``pio`` offline: no telemetry, no update checks, no prompts."""
    env = dict(os.environ)
    env.setdefault("PLATFORMIO_SETTING_ENABLE_TELEMETRY", "No")
    env.setdefault("PLATFORMIO_SETTING_CHECK_PLATFORMIO_INTERVAL", "3650")
    env.setdefault("PLATFORMIO_SETTING_CHECK_PRUNE_SYSTEM_THRESHOLD", "0")
    env.setdefault("PLATFORMIO_SETTING_ENABLE_PROXY_STRICT_SSL", "No")
    env["PLATFORMIO_CORE_DIR"] = str(pio_core_dir())
    env.setdefault("PLATFORMIO_NO_ANSI", "true")
    return env


def find_pio() -> Path:
    """Path of the ``pio`` executable: the one beside this Python first, then ``$PATH``."""
    here = Path(sys.executable).parent
    for name in ("pio", "platformio"):
        cand = here / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    for name in ("pio", "platformio"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ToolchainError(
        "PlatformIO (pio) not found. Install the device extra: "
        "pip install 'tinytrain-mcu[device]'  (in a checkout: scripts/bootstrap.sh)"
    )


def _apt_hint(packages: list[str]) -> str:
    pk = " ".join(packages)
    return f"install the Debian package(s) {pk}: sudo apt-get update && sudo apt-get install -y {pk}"


def check_system_tools() -> dict[str, str]:
    """Paths of the system tools; raises :class:`ToolchainError` naming every missing Debian package."""
    found, missing = {}, []
    for exe, pkg in SYSTEM_TOOLS.items():
        path = shutil.which(exe)
        if path:
            found[exe] = path
        else:
            missing.append((exe, pkg))
    newlib = next((d for d in NEWLIB_DIRS if Path(d, "libc.a").is_file()), None)
    if newlib:
        found["newlib"] = newlib
    else:
        missing.append(("newlib (libc.a for arm-none-eabi)", NEWLIB_PACKAGE))
    if missing:
        what = ", ".join(exe for exe, _ in missing)
        raise ToolchainError(f"missing {what}; " + _apt_hint([pkg for _, pkg in missing]))
    return found


# --- tool-scons ----------------------------------------------------------------------------

def _scons_requirement() -> str:
    """PlatformIO's version requirement for tool-scons, e.g. ``~4.41101.0``."""
    try:
        from platformio.dependencies import get_core_dependencies
    except ImportError as exc:
        raise ToolchainError(
            "the platformio Python package is missing: .venv/bin/pip install -e '.[device]'"
        ) from exc
    return get_core_dependencies()["tool-scons"]


def _scons_version_for(requirement: str) -> tuple[str, str]:
    """(tool-scons version, matching SCons release): ``~4.41101.0`` -> (``4.41101.0``, ``4.11.1``).

    PlatformIO numbers tool-scons as MAJOR.(MAJOR MINOR:02 PATCH:02).0, so 4.41101.0 is SCons 4.11.1.
    """
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", requirement)
    if not m:
        raise ToolchainError(f"cannot read the tool-scons requirement {requirement!r}")
    major, packed, _ = m.groups()
    tool_version = ".".join(m.groups())
    rest = packed[len(major):]
    scons = f"{major}.{int(rest[:-2])}.{int(rest[-2:])}" if len(rest) >= 3 else major
    return tool_version, scons


def _installed_scons() -> tuple[Path, str] | None:
    """(directory of the importable SCons package, its version) or None."""
    try:
        import SCons  # noqa: F401
        from SCons import __version__ as version
    except ImportError:
        return None
    return Path(SCons.__file__).parent, version


def _downloaded_scons(version: str, quiet: bool) -> tuple[Path, str] | None:
    """SCons from the PyPI wheel (``pip download``), unpacked into a temp folder; None if offline."""
    tmp = Path(tempfile.mkdtemp(prefix="tt-scons-"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
           "-d", str(tmp), f"scons=={version}"]
    _say(f"downloading the scons {version} wheel from PyPI", quiet)
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    wheels = list(tmp.glob("*.whl"))
    if not wheels:
        return None
    import zipfile

    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp / "unpacked")
    pkg = tmp / "unpacked" / "SCons"
    return (pkg, version) if pkg.is_dir() else None


SCONS_ENTRY = '''\
#!/usr/bin/env python
"""SCons entry point for PlatformIO (tool-scons built offline by tinytrain.device.toolchain)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import SCons.Script  # noqa: E402

if __name__ == "__main__":
    SCons.Script.main()
'''


def _tool_scons_current(tool_version: str | None = None) -> bool:
    """Is tool-scons installed in the version this PlatformIO wants?"""
    if tool_version is None:
        tool_version = _scons_version_for(_scons_requirement())[0]
    dest = pio_core_dir() / "packages" / "tool-scons"
    try:
        meta = json.loads((dest / ".piopm").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == tool_version and (dest / "scons.py").is_file() and (dest / "SCons").is_dir()


def install_tool_scons(quiet: bool = False, force: bool = False) -> Path:
    """Create ``<core_dir>/packages/tool-scons`` from the scons distribution; idempotent."""
    requirement = _scons_requirement()
    tool_version, want_scons = _scons_version_for(requirement)
    dest = pio_core_dir() / "packages" / "tool-scons"
    if not force and _tool_scons_current(tool_version):
        _say(f"tool-scons {tool_version} already installed in {dest}", quiet)
        return dest

    src = _installed_scons()
    if src is None or src[1] != want_scons:
        src = _downloaded_scons(want_scons, quiet) or src
    if src is None:
        raise ToolchainError(
            "SCons is not installed and could not be downloaded; "
            f"install it: {sys.executable} -m pip install 'scons=={want_scons}'"
        )
    scons_dir, scons_version = src
    if scons_version != want_scons:
        _say(f"note: PlatformIO expects SCons {want_scons}, using installed {scons_version}", quiet)

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copytree(scons_dir, dest / "SCons",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*Tests.py", "*Test.py"))
    (dest / "scons.py").write_text(SCONS_ENTRY)
    (dest / "package.json").write_text(json.dumps({
        "name": "tool-scons",
        "version": tool_version,
        "description": f"SCons {scons_version} (from the PyPI distribution, packaged offline)",
        "keywords": ["build tool"],
        "homepage": "https://scons.org",
        "license": "MIT",
        "system": "*",
        "built_by": SCONS_MARKER,
    }, indent=2) + "\n")
    (dest / ".piopm").write_text(json.dumps({
        "type": "tool",
        "name": "tool-scons",
        "version": tool_version,
        "spec": {"owner": "platformio", "id": None, "name": "tool-scons",
                 "requirements": requirement, "uri": None},
    }))
    _say(f"installed tool-scons {tool_version} (SCons {scons_version}) into {dest}", quiet)
    return dest


def _tree_hash(root: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _linked_qemu_platforms(platforms: Path) -> list[Path]:
    """PlatformIO's links to other copies of qemu-cortexm (``symlink://`` projects of older
    tinytrain versions leave ``*.pio-link`` files): a link with the same name and version would
    be chosen instead of the installed copy, and may lack boards."""
    out = []
    for link in platforms.glob("*.pio-link"):
        try:
            uri = json.loads(link.read_text()).get("spec", {}).get("uri") or ""
        except (OSError, ValueError):
            continue
        if uri.rstrip("/").endswith("/platform-qemu-cortexm"):
            out.append(link)
    return out


def _drop_linked_qemu_platforms(platforms: Path) -> None:
    """Remove those links (under the exclusive core_lock)."""
    for link in _linked_qemu_platforms(platforms):
        link.unlink(missing_ok=True)


@contextlib.contextmanager
def core_lock(shared: bool = False):
    """A lock on PlatformIO's core folder: exclusive while tinytrain installs into it (tool-scons,
    the offline platform), shared while a build uses it, so an install never replaces a folder
    under a running ``pio run`` of another process."""
    import fcntl

    core = pio_core_dir()
    core.mkdir(parents=True, exist_ok=True)
    with open(core / ".tinytrain-platform.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install_qemu_platform(quiet: bool = False) -> Path:
    """Install the package's offline platform (``qemu-cortexm``) into PlatformIO's own platforms
    folder with ``pio pkg install -g``, so generated projects say ``platform =
    qemu-cortexm@<version>`` and name no path (they stay buildable when moved). Reinstalled when
    the package's copy changes (a stamp holds its content hash). Under the exclusive core_lock:
    parallel builds may call this at once, and builds hold the lock shared while they run."""
    from tinytrain.resources import QEMU_PLATFORM_DIR

    core = pio_core_dir()
    dest = core / "platforms" / "qemu-cortexm"
    want = _tree_hash(QEMU_PLATFORM_DIR)
    stamp = dest / ".tinytrain-hash"
    with core_lock():
        _drop_linked_qemu_platforms(core / "platforms")
        if stamp.is_file() and stamp.read_text() == want:
            return dest
        if dest.exists():
            shutil.rmtree(dest)
        cmd = [str(find_pio()), "pkg", "install", "-g", "--platform", QEMU_PLATFORM_DIR.as_uri()]
        r = subprocess.run(cmd, capture_output=True, text=True, env=pio_env(), stdin=subprocess.DEVNULL)
        if r.returncode != 0 or not (dest / "platform.json").is_file():
            raise ToolchainError(f"could not install the offline PlatformIO platform ({' '.join(cmd)}): "
                                 + (r.stdout + r.stderr).strip()[-500:])
        stamp.write_text(want)
    _say(f"installed the offline platform qemu-cortexm into {dest}", quiet)
    return dest


def setup(quiet: bool = False) -> dict[str, str]:
    """Check the Debian tools, install tool-scons and the offline platform; idempotent. Returns
    tool -> path."""
    found = check_system_tools()
    found["pio"] = str(find_pio())
    # every build calls this: when all is installed (the usual case) it is checked under the
    # shared lock, which running builds hold too; the exclusive lock waits for every build of
    # every process to finish, so taking it each time made parallel builds run one at a time
    with core_lock(shared=True):
        ready = _tool_scons_current() and _qemu_platform_installed() is not None and \
            not _linked_qemu_platforms(pio_core_dir() / "platforms")
    if ready:
        found["tool-scons"] = str(pio_core_dir() / "packages" / "tool-scons")
        found["qemu-cortexm platform"] = str(pio_core_dir() / "platforms" / "qemu-cortexm")
    else:
        with core_lock():  # two first builds at once must not both copy tool-scons
            found["tool-scons"] = str(install_tool_scons(quiet=quiet))
        found["qemu-cortexm platform"] = str(install_qemu_platform(quiet=quiet))
    for k, v in found.items():
        _say(f"{k}: {v}", quiet)
    return found


def _module(name: str) -> str | None:
    import importlib.util

    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None else None


def _tool_scons_installed() -> str | None:
    d = pio_core_dir() / "packages" / "tool-scons"
    return str(d) if (d / "scons.py").is_file() and (d / ".piopm").is_file() else None


def _qemu_platform_installed() -> str | None:
    from tinytrain.resources import QEMU_PLATFORM_DIR

    stamp = pio_core_dir() / "platforms" / "qemu-cortexm" / ".tinytrain-hash"
    return str(stamp.parent) if stamp.is_file() and stamp.read_text() == _tree_hash(QEMU_PLATFORM_DIR) else None


def _pio_path() -> str | None:
    try:
        return str(find_pio())
    except ToolchainError:
        return None


def requirements() -> list[dict]:
    """What each command needs, found or not: rows of name, found (a path or None), needed_by,
    fix. Checks the package's own files too (a wheel without its C runtime is a broken install)."""
    from tinytrain import resources as R

    pip = "pip install 'tinytrain-mcu[{}]'"
    apt = "apt-get install -y {}"
    newlib = next((d for d in NEWLIB_DIRS if Path(d, "libc.a").is_file()), None)
    rows = [
        ("C runtime (package data)", str(R.FIRMWARE) if (R.FIRMWARE_SRC / "tt_dense.c").is_file() else None,
         "codegen, build, verify", "reinstall: pip install --force-reinstall tinytrain-mcu"),
        ("board registry and offline platform", str(R.BOARDS_DIR) if R.TARGETS_JSON.is_file()
         and (R.QEMU_PLATFORM_DIR / "platform.json").is_file() else None,
         "build, verify --board, federate --board", "reinstall: pip install --force-reinstall tinytrain-mcu"),
        ("host C compiler (gcc)", shutil.which("gcc"), "verify --board host, the C tests", apt.format("gcc")),
        ("cffi", _module("cffi"), "verify --board host", "pip install cffi"),
        ("arm-none-eabi-gcc", shutil.which("arm-none-eabi-gcc"), "build, verify --board, federate --board",
         apt.format("gcc-arm-none-eabi")),
        ("newlib for arm-none-eabi", newlib, "build, verify --board, federate --board", apt.format(NEWLIB_PACKAGE)),
        ("PlatformIO (pio)", _pio_path(), "build, verify --board, federate --board", pip.format("device")),
        ("PlatformIO tool-scons (offline)", _tool_scons_installed(), "build, verify --board, federate --board",
         "python -m tinytrain.device.toolchain setup"),
        ("offline platform qemu-cortexm (installed)", _qemu_platform_installed(),
         "build, verify --board, federate --board on emulated boards", "python -m tinytrain.device.toolchain setup"),
        ("qemu-system-arm", shutil.which("qemu-system-arm"), "verify/emulate/federate on emulated boards",
         apt.format("qemu-system-arm")),
        ("scikit-learn (digits data)", _module("sklearn"), "--data digits, digits-image", pip.format("data")),
        ("mnist1d", _module("mnist1d"), "--data mnist1d", pip.format("data")),
        ("matplotlib", _module("matplotlib"), "--plot", pip.format("plot")),
        ("flwr", _module("flwr"), "federate --flower, examples/federated_flower.py", pip.format("flower")),
    ]
    return [{"name": n, "found": f, "needed_by": u, "fix": fix} for n, f, u, fix in rows]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tinytrain.device.toolchain", description=__doc__.split("\n")[0],
                                 epilog="check: exit 0 when everything is there, 1 when something is "
                                 "missing (each missing row says which commands need it and how to install it)")
    ap.add_argument("command", choices=["setup", "check"])
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    ap.add_argument("--json", action="store_true", help="check: print the rows as JSON")
    args = ap.parse_args(argv)
    if args.command == "check":
        rows = requirements()
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                state = r["found"] if r["found"] else f"MISSING (needed by {r['needed_by']}): {r['fix']}"
                print(f"{r['name']:38s} {state}")
        return 0 if all(r["found"] for r in rows) else 1
    try:
        setup(quiet=args.quiet)
    except ToolchainError as exc:
        print(f"tinytrain toolchain: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

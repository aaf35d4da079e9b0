"""Offline set-up of the device toolchain: system ARM GCC, newlib, QEMU, and PlatformIO's tool-scons.

PlatformIO runs every build through SCons, which it normally downloads from its registry as the
core package ``tool-scons``. That registry is unreachable here, so :func:`setup` builds the package
from the ``scons`` distribution installed from PyPI (the ``device`` extra): the ``SCons`` package
is copied to ``<core_dir>/packages/tool-scons/`` next to a ``scons.py`` entry, a ``package.json``
and a ``.piopm`` that names owner ``platformio`` and the version PlatformIO requires
(``platformio/dependencies.py``). Everything else (compiler, C library, emulator) comes from Debian.

    python -m tinytrain.toolchain setup [--quiet]     # idempotent; exit 1 with a message on failure
    python -m tinytrain.toolchain check               # report only, installs nothing
"""

from __future__ import annotations

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
        ".venv/bin/pip install -e '.[device]'  (or run scripts/bootstrap.sh)"
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
"""SCons entry point for PlatformIO (tool-scons built offline by tinytrain.toolchain)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import SCons.Script  # noqa: E402

if __name__ == "__main__":
    SCons.Script.main()
'''


def install_tool_scons(quiet: bool = False, force: bool = False) -> Path:
    """Create ``<core_dir>/packages/tool-scons`` from the scons distribution; idempotent."""
    requirement = _scons_requirement()
    tool_version, want_scons = _scons_version_for(requirement)
    dest = pio_core_dir() / "packages" / "tool-scons"
    piopm = dest / ".piopm"
    if not force and piopm.is_file() and (dest / "scons.py").is_file():
        try:
            meta = json.loads(piopm.read_text())
            if meta.get("version") == tool_version and (dest / "SCons").is_dir():
                _say(f"tool-scons {tool_version} already installed in {dest}", quiet)
                return dest
        except (OSError, ValueError):
            pass

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


def setup(quiet: bool = False) -> dict[str, str]:
    """Check the Debian tools and install tool-scons; idempotent. Returns tool -> path."""
    found = check_system_tools()
    found["pio"] = str(find_pio())
    found["tool-scons"] = str(install_tool_scons(quiet=quiet))
    for k, v in found.items():
        _say(f"{k}: {v}", quiet)
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tinytrain.toolchain", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["setup", "check"])
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    args = ap.parse_args(argv)
    try:
        if args.command == "setup":
            setup(quiet=args.quiet)
        else:
            for k, v in check_system_tools().items():
                print(f"{k}: {v}")
            print(f"pio: {find_pio()}")
    except ToolchainError as exc:
        print(f"tinytrain toolchain: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

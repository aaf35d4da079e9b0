"""The built wheel and sdist are complete: installed into a fresh virtual environment outside
the repository, the README flow runs from an empty folder (train W1, codegen, build for
mps2_an386, verify on QEMU and on the host C, a simulated federated round).

The fresh environment gets the wheel without dependencies and reaches the test environment's
installed dependencies through a path entry (no network needed, no copy of the checkout: a
``.pth`` line adds a folder to sys.path but does not run the editable install's finder in it).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNTIME = ["tinytrain/firmware/include/tt_dense.h", "tinytrain/firmware/src/tt_dense.c",
           "tinytrain/firmware/ports/mps2/mps2.ld", "tinytrain/firmware/library.json",
           "tinytrain/firmware/ports/arduino/tt_arduino_main.cpp", "tinytrain/device/boards/targets.json",
           "tinytrain/device/boards/platform-qemu-cortexm/platform.json",
           "tinytrain/device/boards/platform-qemu-cortexm/builder/main.py", "tinytrain/codegen/emit.py",
           "tinytrain/federated/engine.py"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # build from a copy: setuptools reuses build/ in the source tree, where files deleted since
    # an earlier build would still be packed
    src = tmp_path_factory.mktemp("src") / "tinytrain-mcu"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "runs"))
    built = []
    for hook in ("build_wheel", "build_sdist"):  # one process each: setuptools keeps state between them
        code = f"import sys; from setuptools import build_meta as b; print('BUILT', b.{hook}(sys.argv[1]))"
        r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        built.append(out / next(ln for ln in r.stdout.splitlines() if ln.startswith("BUILT ")).split()[1])
    return tuple(built)


def test_wheel_and_sdist_hold_the_runtime(dist):
    wheel, sdist = dist
    assert wheel.name.startswith("tinytrain_mcu-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [f for f in RUNTIME if f not in names], [f for f in RUNTIME if f not in names]
    assert not [n for n in names if n.startswith(("codegen/", "firmware/", "boards/", "tests/"))]
    assert not [n for n in names if n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Name: tinytrain-mcu" in meta and "License-Expression: Apache-2.0" in meta
    assert any(n.endswith("licenses/LICENSE") for n in names)
    with tarfile.open(sdist) as t:
        snames = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert not [f for f in RUNTIME + ["LICENSE", "pyproject.toml"] if f not in snames]


@pytest.mark.qemu
@pytest.mark.slow
def test_readme_flow_from_the_wheel(dist, tmp_path):
    wheel, _ = dist
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the wheel is unpacked as pip would install it (no pip in the venv: no network, no cache)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    (site / "tinytrain_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "empty"
    work.mkdir()
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TINYTRAIN_CACHE": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)

    def tt(*args):
        r = subprocess.run([str(py), "-m", "tinytrain", *args], cwd=work, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, f"tinytrain {' '.join(args)}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        return r.stdout

    where = subprocess.run([str(py), "-c", "import tinytrain, tinytrain.resources as r; print(tinytrain.__file__); "
                            "print(r.FIRMWARE)"], cwd=work, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout  # not the checkout
    tt("train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--seed", "0", "--out", "w1.tt")
    tt("codegen", "--model", "w1.tt", "--out", "gen")
    assert (work / "gen" / "tt_model.c").is_file()
    tt("build", "--model", "w1.tt", "--board", "mps2_an386", "--out", "fw")
    r = json.loads(tt("verify", "--board", "mps2_an386", "--model", "w1.tt", "--steps", "60", "--json")
                   .strip().splitlines()[-1])
    assert r["mismatches"] == 0 and r["steps"] == 60
    r = json.loads(tt("verify", "--board", "host", "--model", "w1.tt", "--steps", "200", "--json")
                   .strip().splitlines()[-1])
    assert r["mismatches"] == 0 and r["steps"] == 200
    r = json.loads(tt("federate", "--simulated", "3", "--rounds", "1", "--model", "w1.tt", "--json")
                   .strip().splitlines()[-1])
    assert len(r["history"]) == 1 and 0.0 < r["final_accuracy"] <= 1.0
    assert list(work.iterdir()) and not (work / "tinytrain").exists()

"""MANTA as a volunteer installs it: a wheel built from this tree holds MANTA's packages and its
licence, and installed with ``--no-deps`` into a fresh virtual environment (which sees the cached
dependency set through a .pth file, as scripts/make_venv.sh does: no network), its console scripts
run from outside the source tree."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from protocol import DISTRIBUTION, __version__
from tests.test_layout import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def _source_copy(dest: Path) -> Path:
    """What a wheel is built from, copied (pip builds in the tree: its build/ must not land here)."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _build_wheel(tmp_path: Path) -> Path:
    source = _source_copy(tmp_path / "source")
    out = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_wheel_installs_only_manta_and_its_scripts_run_without_the_source_tree(tmp_path):
    (tmp_path / "source").mkdir()
    wheel = _build_wheel(tmp_path)
    assert wheel.name.startswith(f"{DISTRIBUTION.replace('-', '_')}-{__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = f"{DISTRIBUTION.replace('-', '_')}-{__version__}.dist-info"
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        licence = archive.read(f"{dist_info}/licenses/LICENSE").decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {*PACKAGES, dist_info}, sorted(tops - {*PACKAGES, dist_info})
    assert "aggregator/monitor/static/index.html" in names  # package data
    assert licence == (ROOT / "LICENSE").read_text() and "Apache License" in licence
    assert f"Name: {DISTRIBUTION}\n" in metadata
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata

    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    deps = Path(importlib.util.find_spec("click").origin).parents[1]  # the cached dependency set
    site = venv / "lib" / f"python{version}" / "site-packages"
    (site / "_manta_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert not (site / "tests").exists() and not (site / "benchmarks").exists()

    elsewhere = tmp_path / "elsewhere"  # not the source tree: imports must come from the venv
    elsewhere.mkdir()
    for script in ("manta-peer", "manta-ledger"):
        helped = subprocess.run(
            [str(venv / "bin" / script), "--help"], capture_output=True, text=True, timeout=120, cwd=elsewhere
        )
        assert helped.returncode == 0, helped.stderr[-3000:]
        assert f"Usage: {script}" in helped.stdout
    versioned = subprocess.run(
        [str(venv / "bin" / "manta-peer"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=elsewhere,
    )
    assert versioned.stdout.strip() == f"manta-peer, version {__version__}", versioned.stderr
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import peer; print(peer.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=elsewhere,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr

"""`manta-peer identity` as a real console script."""

from __future__ import annotations

import os
import stat
import subprocess

from protocol.identity import Identity
from tests.helpers import console_script


def _run(*args, home):
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(
        [console_script("manta-peer"), "identity", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_identity_creates_the_default_key_and_prints_it(tmp_path):
    first = _run(home=tmp_path)
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / ".manta" / "identity.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    ident = Identity.load(key_file)
    assert f"public key:  {ident.public_key_hex}" in first.stdout
    assert f"fingerprint: {ident.fingerprint}" in first.stdout
    assert "(created)" in first.stdout
    second = _run(home=tmp_path)
    assert second.returncode == 0 and "(created)" not in second.stdout
    assert ident.public_key_hex in second.stdout


def test_identity_takes_a_path_and_refuses_a_readable_key_in_one_line(tmp_path):
    path = tmp_path / "keys" / "peer.key"
    done = _run("--identity", str(path), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Identity.load(path).fingerprint in done.stdout
    path.chmod(0o644)
    refused = _run("--identity", str(path), home=tmp_path)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "readable by group or others" in lines[0]

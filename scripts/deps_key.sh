#!/usr/bin/env bash
# Prints the cache key of the dependency environment: a hash of the declared dependencies (not the
# whole pyproject.toml, so editing pytest settings does not trigger a reinstall), constraints.txt,
# the interpreter version and the machine architecture.
set -euo pipefail
python=${1:-python3}
cd "$(dirname "$0")/.."
{
  "$python" - <<'PY'
import json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(json.dumps([p["requires-python"], p["dependencies"], p.get("optional-dependencies", {})], sort_keys=True))
PY
  cat constraints.txt
  "$python" -c 'import sys, platform; print(sys.version, platform.machine())'
} | sha256sum | cut -c1-16

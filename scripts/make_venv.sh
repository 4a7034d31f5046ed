#!/usr/bin/env bash
# Builds (or reuses) the cached dependency environment for KEY, then a thin .venv in the clone that
# sees it and holds the editable MANTA install. See the Makefile header for the why.
set -euo pipefail
python=$1 key=$2 venv=$3 stamp=${4:-$3/.manta-deps-$2}
# The interpreter the venvs are made from, as an absolute path outside any venv: make puts .venv/bin
# first on PATH, so "python3" may be the very .venv this script is about to replace.
python=$("$python" -c 'import sys; print(getattr(sys, "_base_executable", None) or sys.executable)')
cache=${MANTA_CACHE_DIR:-$HOME/.cache/manta}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
deps="$cache/deps-py$pyver-$key"
pip_version=26.3
mkdir -p "$cache"
cd "$(dirname "$0")/.."

# One builder at a time per cache (two clones running `make test` at once must not both install).
exec 9>"$cache/.lock"
flock 9
if [[ ! -f "$deps/.complete" ]]; then
  echo "manta: installing dependencies into $deps (first run for this dependency set; about 2 minutes)"
  start=$SECONDS
  rm -rf "$deps"
  "$python" -m venv "$deps"
  "$deps/bin/python" -m pip install -q "pip==$pip_version"
  reqs=$(mktemp)
  "$python" - >"$reqs" <<'PY'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in p["dependencies"] + [r for extra in p.get("optional-dependencies", {}).values() for r in extra]:
    print(req)
PY
  "$deps/bin/python" -m pip install -q --progress-bar off -c constraints.txt -r "$reqs"
  rm -f "$reqs"
  touch "$deps/.complete"
  echo "manta: dependencies installed in $((SECONDS - start)) s"
  # Keep the two most recently used dependency sets; older ones are ~5 GB each.
  ls -1dt "$cache"/deps-* 2>/dev/null | tail -n +3 | xargs -r rm -rf
fi
touch "$deps/.complete"  # marks it recently used for the pruning above
flock -u 9

rm -rf "$venv"
"$python" -m venv --without-pip "$venv"
site="$venv/lib/python$pyver/site-packages"
echo "import site; site.addsitedir('$deps/lib/python$pyver/site-packages')" >"$site/_manta_deps.pth"
"$deps/bin/python" -m pip --python "$venv/bin/python" install -q --no-deps --no-build-isolation -e .
touch "$stamp"
echo "manta: .venv ready (dependencies from $deps)"

#!/usr/bin/env bash
# Resolves pyproject's ranges afresh in a scratch environment and writes the result to constraints.txt.
set -euo pipefail
python=${1:-python3}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/env"
"$tmp/env/bin/python" -m pip install -q "pip==26.3"
"$tmp/env/bin/python" -m pip install -q ".[dev]"
{
  echo "# Versions known to work together here (Python 3.11, Linux x86-64; torch is the CUDA build from PyPI,"
  echo "# which also runs on the CPU). Regenerate with 'make constraints' after changing pyproject's ranges."
  "$tmp/env/bin/python" -m pip freeze --exclude-editable | grep -v -i '^manta-swarm[ =@]' | sort -f
} >constraints.txt
echo "constraints.txt updated"

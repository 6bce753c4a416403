#!/bin/bash
# rig setup hook: build the AMD repository TEST DOUBLE (repo.radeon.com layout, signed with a throwaway
# test key, Origin: repo.radeon.com) into $RIG_REPO/amd, served as http://controller:8080/amd/.
# Idempotent: rebuilds only when build.py, the rocm role's version map or the captures changed.
set -euo pipefail
REPO_ROOT=${REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
RIG_HOME=${RIG_HOME:-$REPO_ROOT/.rig}
RIG_REPO=${RIG_REPO:-$RIG_HOME/repo}
for tool in dpkg-deb dpkg-scanpackages gpg; do
  command -v "$tool" >/dev/null || { echo "amd-repo.sh: $tool missing (apt-get install dpkg-dev gpg)" >&2; exit 1; }
done
exec python3 "$REPO_ROOT/tools/testhosts/amd_repo_testdouble/build.py" \
  --out "$RIG_REPO/amd" --keydir "$RIG_HOME/amd-testdouble-gnupg" "$@"

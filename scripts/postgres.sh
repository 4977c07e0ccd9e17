#!/usr/bin/env bash
# PostgreSQL for the shared-state tests (tests/shared): Debian's `postgresql` package, installed with apt-get
# when its server binaries are missing. The tests start their own server from these binaries (initdb into a
# temporary directory); nothing is configured or started system-wide here (the package's own cluster, if the
# package starts one, is left alone and not used).
#
# When the binaries cannot be had (no apt-get, not root, the archive unreachable), the reason goes to
# tests/.postgres-unavailable and those tests skip with it; a present or freshly installed server clears it.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
unavailable="$here/tests/.postgres-unavailable"
rm -f "$unavailable"

have() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }

if have; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL is not installed and there is no apt-get to install it; install postgresql (initdb, pg_ctl)" > "$unavailable"
elif [ "$(id -u)" != 0 ]; then
  echo "PostgreSQL is not installed; installing it needs root (apt-get install postgresql)" > "$unavailable"
else
  log="$(mktemp)"
  echo "postgres: installing Debian's postgresql package (for tests/shared)"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } > "$log" 2>&1; then
    { echo "apt-get install postgresql failed:"; tail -n 3 "$log"; } > "$unavailable"
  fi
  rm -f "$log"
  have || [ -e "$unavailable" ] || echo "postgresql installed but initdb was not found" > "$unavailable"
fi
if [ -e "$unavailable" ]; then
  echo "PostgreSQL unavailable, the shared-state tests will be skipped: $(cat "$unavailable")"
fi
exit 0

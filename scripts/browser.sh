#!/usr/bin/env bash
# A real browser for the dashboard's tests (tests/browser/): Debian's headless Chromium, installed with apt-get
# when missing and we are root. Playwright (a test extra) drives it; its own browser download is never used.
#
# When no Chromium can be had (not root, no apt-get, the package mirror unreachable), the reason goes to
# tests/browser/.unavailable and the browser tests skip with it, as the npm clients and the real llama-server
# do; the rest of the suite runs.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
unavailable="$here/tests/browser/.unavailable"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rm -f "$unavailable"

find_chromium() {
  for c in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if chromium="$(find_chromium)"; then
  echo "browser: $("$chromium" --version 2>/dev/null | head -n 1)"
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is not installed, and this is not a root Debian/Ubuntu shell that could apt-get install it" > "$unavailable"
  echo "browser: $(cat "$unavailable"); the browser tests will be skipped"
  exit 0
fi

echo "browser: installing Debian's chromium (first run only)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends chromium fonts-liberation; } > "$log" 2>&1; then
  { echo "apt-get could not install chromium:"; tail -n 3 "$log"; } > "$unavailable"
  echo "browser: $(head -n 1 "$unavailable"); the browser tests will be skipped"
  exit 0
fi
chromium="$(find_chromium)" || { echo "apt-get installed chromium but no binary was found" > "$unavailable"; exit 0; }
echo "browser: $("$chromium" --version 2>/dev/null | head -n 1)"

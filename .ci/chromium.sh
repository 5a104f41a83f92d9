# Sourced by .ci/run: installs Debian's Chromium for the browser tests (tests/integration/test_browser_ui.py).
# Nothing is started here: the test starts its own headless Chromium and real Airflow on 127.0.0.1:28100-28119
# and stops both (by process group) when it ends.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

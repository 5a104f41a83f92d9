#!/usr/bin/env bash
# Sourced by .ci/run (may also be run): Redis for the multi-host test's Celery workers
# (tests/airflow/test_multi_host.py).
#
# 1. installs Debian's redis-server when missing (apt-get);
# 2. starts it on 127.0.0.1 on a free port, with a random password, no persistence (--save "",
#    --appendonly no), in the background; the packaged service (:6379), if the install started one, is
#    stopped again;
# 3. waits until it answers PING (AUTODL_REDIS_WAIT_S, default 30 s).
# The server started here is recorded (.ci/services.sh) and stopped, by its pid, when .ci/run ends.
# Exports AUTODL_TEST_REDIS_URL=redis://:PASSWORD@127.0.0.1:PORT/0 when it answers; without it the test
# starts (and stops) its own redis-server. Log: ${AUTODL_REDIS_LOG:-/tmp/autodl-redis.log}.

_autodl_redis_setup() {
    local sudo="" log="${AUTODL_REDIS_LOG:-/tmp/autodl-redis.log}" wait_s="${AUTODL_REDIS_WAIT_S:-30}"
    if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; fi
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "redis.sh: installing Debian's redis-server" >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server >&2 \
          || { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
               apt-get install -y --no-install-recommends redis-server >&2; } \
          || { echo "redis.sh: apt-get could not install redis-server" >&2; return 1; }
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet redis-server 2>/dev/null; then
            $sudo systemctl stop redis-server >&2 || true   # the install started the packaged service: stop it
        fi
    fi
    local port password pid i=0
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    redis-server --bind 127.0.0.1 --port "$port" --requirepass "$password" --save "" --appendonly no \
        >>"$log" 2>&1 &
    pid=$!
    while [ "$i" -lt "$wait_s" ]; do
        if REDISCLI_AUTH="$password" redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            export AUTODL_TEST_REDIS_URL="redis://:${password}@127.0.0.1:${port}/0"
            if declare -F autodl_ci_started >/dev/null; then autodl_ci_started redis-server "$pid" TERM; fi
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 1; i=$((i + 1))
    done
    echo "redis.sh: redis-server did not answer on 127.0.0.1:$port (log: $log)" >&2
    kill "$pid" 2>/dev/null || true
    return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _autodl_redis_setup; exit $?
else
    _autodl_redis_setup
fi

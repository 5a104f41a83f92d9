#!/usr/bin/env bash
# Make a Docker engine answer on this machine for tests/integration (sourced by .ci/run; may also be run).
#
# 1. installs Debian's docker.io (dockerd, containerd, runc) and busybox-static when missing (apt-get);
# 2. starts `dockerd --bridge=none --iptables=false` in the background when no engine answers
#    (no bridge, no iptables: the tests run every container with --network none);
# 3. waits until `docker info` answers (AUTODL_DOCKERD_WAIT_S, default 60 s).
# Idempotent: a running engine is left alone; one started here is recorded (.ci/services.sh) and stopped,
# by its pid, when .ci/run ends. Extra dockerd flags: AUTODL_DOCKERD_ARGS (e.g.
# "--storage-driver vfs" where overlayfs is not allowed). dockerd's log: ${AUTODL_DOCKERD_LOG:-/tmp/autodl-dockerd.log}.
# Exports AUTODL_DOCKER_READY=1 when the engine answers; returns/exits non-zero otherwise.

_autodl_docker_setup() {
    local log="${AUTODL_DOCKERD_LOG:-/tmp/autodl-dockerd.log}"
    local wait_s="${AUTODL_DOCKERD_WAIT_S:-60}"
    local sudo=""
    if [ "$(id -u)" != "0" ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
            echo "docker.sh: not root and no sudo: cannot install or start dockerd" >&2; return 1
        fi
    fi
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1 || [ ! -x /bin/busybox ]; then
        echo "docker.sh: installing docker.io busybox-static" >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io busybox-static >&2 \
          || { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
               apt-get install -y --no-install-recommends docker.io busybox-static >&2; } \
          || { echo "docker.sh: apt-get could not install docker.io busybox-static" >&2; return 1; }
    fi
    if docker info >/dev/null 2>&1; then
        export AUTODL_DOCKER_READY=1; return 0
    fi
    local args="${AUTODL_DOCKERD_ARGS:-}"
    local attempt started_pid=""
    for attempt in 1 2; do
        if [ -z "$started_pid" ] && pgrep -x dockerd >/dev/null 2>&1; then
            :  # an engine someone else started is still coming up: wait for it, never stop it
        elif [ -z "$started_pid" ] || ! kill -0 "$started_pid" 2>/dev/null; then
            echo "docker.sh: starting dockerd --bridge=none --iptables=false $args (log: $log)" >&2
            started_pid=$($sudo sh -c "nohup dockerd --bridge=none --iptables=false $args >>'$log' 2>&1 & echo \$!")
        fi
        local i=0
        while [ "$i" -lt "$wait_s" ]; do
            if docker info >/dev/null 2>&1; then
                export AUTODL_DOCKER_READY=1
                if declare -F autodl_ci_started >/dev/null; then autodl_ci_started dockerd "$started_pid" TERM; fi
                return 0
            fi
            sleep 1; i=$((i + 1))
            # dockerd gave up (typically: overlayfs not allowed inside this container): retry once with vfs
            if [ -n "$started_pid" ] && ! kill -0 "$started_pid" 2>/dev/null && [ -z "$args" ] && [ "$attempt" = 1 ]; then
                echo "docker.sh: dockerd exited; retrying with --storage-driver vfs" >&2
                args="--storage-driver vfs"; continue 2
            fi
        done
        break
    done
    echo "docker.sh: no Docker engine answered within ${wait_s} s; last lines of $log:" >&2
    tail -n 20 "$log" >&2 2>/dev/null
    return 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _autodl_docker_setup; exit $?
else
    _autodl_docker_setup
fi

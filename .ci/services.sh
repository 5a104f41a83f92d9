# Sourced by .ci/run first: remembers every service this CI run starts (by pid) and stops exactly those
# when .ci/run ends (trap EXIT), whatever the outcome. Services found already running are never
# recorded, so they are left running.
#
#   autodl_ci_started NAME PID SIGNAL   # after starting a service; SIGNAL: how it shuts down cleanly
#   autodl_ci_stop_started              # the EXIT trap: newest first, SIGNAL, then SIGKILL after 60 s

_autodl_ci_started=()

autodl_ci_started() {
    _autodl_ci_started+=("$1:$2:$3")
    echo "ci: started $1 (pid $2); it is stopped when .ci/run ends" >&2
}

autodl_ci_stop_started() {
    local i entry name pid sig waited
    for ((i = ${#_autodl_ci_started[@]} - 1; i >= 0; i--)); do
        entry=${_autodl_ci_started[$i]}
        name=${entry%%:*}; pid=${entry#*:}; pid=${pid%%:*}; sig=${entry##*:}
        kill -0 "$pid" 2>/dev/null || continue
        echo "ci: stopping $name (pid $pid, SIG$sig)" >&2
        kill -s "$sig" "$pid" 2>/dev/null || true
        waited=0
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
        if kill -0 "$pid" 2>/dev/null; then
            echo "ci: $name (pid $pid) still runs after 60 s: SIGKILL" >&2
            kill -s KILL "$pid" 2>/dev/null || true
        fi
    done
    _autodl_ci_started=()
}

#!/usr/bin/env bash
# Install bubblewrap (bwrap), the sandbox autodl runs user code in (autodl.sandbox), when it is missing.
# Sourced by .ci/run (a failure fails CI: the hostile-script tests in tests/sandbox need it) and run by
# scripts/setup.sh (where a failure is only a warning: without bwrap autodl never runs user code, and the
# probe falls back to the static estimate). Idempotent; checks that a sandbox actually starts here.

_autodl_bwrap_setup() {
    local sudo=""
    if ! command -v bwrap >/dev/null 2>&1; then
        if [ "$(id -u)" != "0" ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
                echo "bubblewrap.sh: bwrap is missing and this user cannot install it: install the 'bubblewrap' package" >&2
                return 1
            fi
        fi
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "bubblewrap.sh: bwrap is missing and there is no apt-get: install bubblewrap with this system's package manager" >&2
            return 1
        fi
        echo "bubblewrap.sh: installing bubblewrap" >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 \
          || { $sudo apt-get update -qq >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
               apt-get install -y -qq --no-install-recommends bubblewrap >&2; } \
          || { echo "bubblewrap.sh: apt-get could not install bubblewrap" >&2; return 1; }
    fi
    if ! bwrap --unshare-all --unshare-user --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
            --symlink usr/lib64 /lib64 --proc /proc --dev /dev -- /usr/bin/true; then
        echo "bubblewrap.sh: bwrap is installed but cannot create its namespaces here (user namespaces not allowed?)" >&2
        return 1
    fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _autodl_bwrap_setup; exit $?
else
    _autodl_bwrap_setup
fi

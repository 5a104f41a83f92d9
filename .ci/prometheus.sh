#!/usr/bin/env bash
# Sourced by .ci/run (may also be run): installs Debian's Prometheus server for tests/integration/test_prometheus.py.
#
# The tests start and stop their own servers (127.0.0.1:29090 scraping test endpoints on 29091-29092, and
# test_prometheus_dcgm_cases.py's on 29093 scraping 29094-29096, test_pod_gpu_samples.py's on free ports; config and
# storage in temporary folders), so
# nothing is left running here. Where the package's own service was started by
# the install (a machine with systemd and no policy-rc.d), it is stopped again: it would listen on :9090.
# Exports AUTODL_PROMETHEUS_READY=1 when /usr/bin/prometheus is there.

_autodl_prometheus_setup() {
    local sudo=""
    if [ "$(id -u)" != "0" ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
            echo "prometheus.sh: not root and no sudo: cannot install prometheus" >&2; return 1
        fi
    fi
    if ! command -v prometheus >/dev/null 2>&1; then
        echo "prometheus.sh: installing Debian's prometheus" >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >&2 \
          || { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
               apt-get install -y --no-install-recommends prometheus >&2; } \
          || { echo "prometheus.sh: apt-get could not install prometheus" >&2; return 1; }
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
            $sudo systemctl stop prometheus >&2 || true   # the install started the packaged service: stop it
        fi
    fi
    command -v prometheus >/dev/null 2>&1 && export AUTODL_PROMETHEUS_READY=1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _autodl_prometheus_setup; exit $?
else
    _autodl_prometheus_setup
fi

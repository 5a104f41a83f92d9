#!/usr/bin/env bash
# The main job: set up, then run the example DAG end to end on embedded defaults (SQLite metadata,
# local launcher, the pool from NVML or include/pools/demo.yaml), then show what was decided.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/airflow_env.sh
mkdir -p "$AIRFLOW_HOME"
airflow db migrate >/dev/null
echo "== airflow dags test autodl_train_simple_cnn (autodl's task log lines) =="
airflow dags test autodl_train_simple_cnn "${1:-$(date -u +%Y-%m-%dT%H:%M:%S+00:00)}" > "$AIRFLOW_HOME/demo-run.log" 2>&1 || true
grep -E "airflow.task.operators.autodl|DagRun Finished" "$AIRFLOW_HOME/demo-run.log" \
  | sed -E 's/^[0-9TZ:.-]+ \[[a-z ]+\] +//; s/ +\[airflow[^]]*\] loc=.*$//; s/(run_duration=[0-9.]+).*(state=[a-z]+).*/\1 \2/'
echo "(full Airflow output: $AIRFLOW_HOME/demo-run.log)"
echo
autodl runs --limit 1
echo "record store: ${AUTODL_STORE_URL:-sqlite:///$AUTODL_HOME/autodl.db}   (autodl runs --json for the full record)"
test "$(autodl runs --json --limit 1 | python -c 'import json,sys; print(json.load(sys.stdin)[0]["outcome"])')" = succeeded

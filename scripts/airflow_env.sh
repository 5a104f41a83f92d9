# Sourced: an embedded Airflow 3 home in ./airflow_home (SQLite metadata, this repo's dags/ and
# plugins/), and autodl's own store beside it. Override any variable before sourcing.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$_root/airflow_home}"
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-$_root/dags}"
export AIRFLOW__CORE__PLUGINS_FOLDER="${AIRFLOW__CORE__PLUGINS_FOLDER:-$_root/plugins}"
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
export AIRFLOW__CORE__UNIT_TEST_MODE="${AIRFLOW__CORE__UNIT_TEST_MODE:-False}"
export AUTODL_HOME="${AUTODL_HOME:-$AIRFLOW_HOME/autodl}"
export PATH="$_root/.venv/bin:$PATH"

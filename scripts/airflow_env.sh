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
# Building or installing autodl from this folder (`pip wheel .`, `pip install .`, `python -m build`) leaves
# plugins/airflow_provider_autodl.egg-info; Airflow puts plugins/ on sys.path, would see the entry point there and in the
# installed package, and report "Plugin 'autodl' already registered" (scripts/setup.sh removes it too).
rm -rf "$_root"/plugins/*.egg-info

#!/bin/sh
# PostgreSQL's first start (docker-entrypoint-initdb.d): autodl's own store in its own database and role,
# apart from Airflow's metadata database. The password comes from AUTODL_DB_PASSWORD (.env).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v pw="$AUTODL_DB_PASSWORD" <<'SQL'
CREATE ROLE autodl LOGIN PASSWORD :'pw';
CREATE DATABASE autodl OWNER autodl;
SQL

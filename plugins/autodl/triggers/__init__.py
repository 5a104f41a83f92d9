"""Airflow triggers (run in the triggerer): waiting for the pool without holding a worker slot."""

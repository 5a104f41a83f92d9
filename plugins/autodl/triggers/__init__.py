"""Airflow triggers (run in the triggerer): waiting in the admission queue and following a training
without holding a worker slot."""

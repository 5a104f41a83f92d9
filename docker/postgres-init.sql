-- autodl keeps its own store (leases, run records) apart from Airflow's metadata database.
CREATE ROLE autodl LOGIN PASSWORD 'autodl';
CREATE DATABASE autodl OWNER autodl;

"""autodl's GPU page in the Airflow UI: the pool, the queue, leases, runs and plots (FastAPI app in :mod:`.app`).

:mod:`.data` reads autodl's own store and inventory (never Airflow's metadata database) into plain
values, :mod:`.plots` draws them, :mod:`.app` serves them behind Airflow's auth.
"""

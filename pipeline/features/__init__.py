"""Point-in-time features of card transactions.

``definitions`` is the one place feature names, windows, categorical vocabularies and
``FEATURE_VERSION`` are declared (ingest, training and scoring import them); ``transforms`` holds
the pure ``DataFrame -> DataFrame`` Spark functions that compute them from the raw store.
"""

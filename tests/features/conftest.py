from tests.spark_fixtures import spark  # noqa: F401  (shared session fixture)

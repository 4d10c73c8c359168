"""The feature definitions: one list, stable categorical codes."""

from __future__ import annotations

import zlib

from pipeline.features import definitions as fd


def test_feature_columns_are_numeric_then_categorical_without_repeats():
    assert fd.FEATURE_COLUMNS == fd.NUMERIC_FEATURES + tuple(fd.CATEGORICAL_FEATURES)
    assert len(set(fd.FEATURE_COLUMNS)) == len(fd.FEATURE_COLUMNS)
    assert set(fd.CATEGORICAL_FEATURES) == set(fd.CATEGORICAL_SOURCES)
    assert {fd.card_count(30), fd.merchant_fraud_rate(7), fd.CARD_SECONDS_SINCE_PREV, "is_night"} <= set(fd.NUMERIC_FEATURES)


def test_categorical_codes_are_stable_hashes_with_zero_for_missing():
    assert fd.categorical_code(None, 16) == 0
    assert fd.categorical_code("", 16) == 0
    assert fd.categorical_code("ecommerce", 16) == 1 + zlib.crc32(b"ecommerce") % 15
    codes = {fd.categorical_code(f"{mcc:04d}", 512) for mcc in range(5000)}
    assert min(codes) >= 1 and max(codes) < 512
    assert len(codes) > 400  # spread over the buckets


def test_schema_fingerprint_names_version_and_columns():
    fp = fd.schema_fingerprint()
    assert fp["feature_version"] == fd.FEATURE_VERSION
    assert fp["numeric_features"] == list(fd.NUMERIC_FEATURES)

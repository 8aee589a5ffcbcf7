"""Logbus storage engine: Kafka-format record batches in segmented, crash-safe partition logs."""

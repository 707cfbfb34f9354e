"""Thin stream consumers: decode, hand the batch to the pipeline, route failures."""

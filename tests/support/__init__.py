"""Helpers shared by the integration and chaos suites: real services, real processes."""

"""Stand-ins for the external services, keeping their real contracts."""

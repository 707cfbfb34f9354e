"""What people and the watchers read of the store, never on the hot path: the console's and the
CLI's queries (``console``), the error groups' views (``error_groups``), the backlog the stuck
sweep and the gauges watch (``backlog``), and the audit written before an unmasked view is served
(``view_audit``)."""

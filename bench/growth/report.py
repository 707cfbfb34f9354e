"""The growth rows' part of the benchmark's report."""

from __future__ import annotations

from bench.growth.plans import Plan, plan_lines


def human(n: int) -> str:
    for size, suffix in ((1_000_000_000, "g"), (1_000_000, "m"), (1_000, "k")):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def render(doc: dict) -> str:
    """The growth part of the report: pre-fill, size, the timings, the plans, the findings."""
    lines = ["", "Growth (rows g):"]
    pre = doc.get("prefill")
    if doc.get("buffer_pool_bytes"):
        lines.append(f"- server as configured: innodb_buffer_pool_size {int(doc['buffer_pool_bytes']) / 2**20:,.0f} MiB; "
                     f"the g workers ran with {doc.get('worker_env')}")
    if doc.get("partitions"):
        names = doc["partitions"]
        lines.append(f"- t_idem's partitions laid out again as migration 0006 does: {len(names)}, "
                     f"{names[0]}, {names[1]} ... {names[-2]}, {names[-1]}")
    if doc.get("error"):
        lines.append(f"- FAILED: {doc['error']}")
    if pre:
        lines.append(f"- pre-fill: {pre['rows']:,} done rows over {pre['first_day']}..{pre['last_day']} in "
                     f"{pre['seconds']:.1f}s (INSERT ... SELECT FROM seq_1_to_N in chunks of {pre['chunk']:,}: "
                     f"{pre['insert_seconds']:.1f}s; ANALYZE TABLE {pre['analyze_seconds']:.1f}s)")
    for label, key in (("after the pre-fill", "size_after_prefill"), ("after the g run", "size_after_run"),
                       ("after the drops", "size_after_drops")):
        s = doc.get(key)
        if s:
            lines.append(f"- t_idem {label}: {s['rows']:,} rows (InnoDB's estimate {s['rows_estimate']:,}), "
                         f"data {s['data_bytes'] / 2**20:,.0f} MiB + indexes {s['index_bytes'] / 2**20:,.0f} MiB = "
                         f"{s['bytes'] / 2**20:,.0f} MiB, {s['bytes_per_row']:.0f} bytes per row"
                         + (f" (files {s['file_bytes'] / 2**20:,.0f} MiB," if s.get("file_bytes") else " (")
                         + f"{s['partitions']} partitions)")
    ops = doc.get("operations")
    if not ops:
        return "\n".join(lines + [f"- operations not measured: {doc.get('operations_error', 'skipped')}"])
    led = ops["ledger"]
    lines.append(f"- t_compensation: {led['rows']:,} rows by status {led['by_status']}, filled in "
                 f"{ops['ledger_fill_seconds']:.1f}s, {led['bytes'] / 2**20:,.0f} MiB")
    lines += ["", "| operation at size | first ms | p50 ms | max ms | n | result |", "|---|---|---|---|---|---|"]
    for t in ops["timings"]:
        lines.append(f"| {t['name']} | {t['first_ms']:.1f} | {t['p50_ms']:.1f} | {t['max_ms']:.1f} | {t['n']} | "
                     f"{_short_result(t['result'])} |")
    for d in ops.get("drops", []):
        lines.append(f"| Partitions.drop([{d['partition']}]): {d['rows']:,} rows (estimate {d['rows_estimate']:,}) "
                     f"| {d['ms']:.1f} | | | 1 | |")
    lines.append("")
    for p in ops["plans"]:
        plan = Plan(p["name"], p["sql"], p["explain"], p["analyze"], p["finding"])
        lines += [f"{p['name']}:", f"  {p['sql']}"] + [f"    {line}" for line in plan_lines(plan)]
    if ops["findings"]:
        lines += ["", "!" * 78, "FINDINGS: these statements read the table, not an index range:"]
        lines += [f"- {f['name']}: {f['finding']}\n  {f['sql']}" for f in ops["findings"]]
        lines.append("!" * 78)
    else:
        lines.append("No statement above reads the table: every plan is an index range or a pruned partition.")
    return "\n".join(lines)


def _short_result(result) -> str:
    text = str(result) if result is not None else ""
    return text if len(text) <= 120 else text[:117] + "..."

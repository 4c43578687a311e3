#!/usr/bin/env python3
"""Writes charts/ferry/dashboards/ferry.json, the Grafana dashboard.

The panels are declared here once, as data, so that every query is easy to
review; the chart ships the generated JSON and the e2e test runs every
panel's query against a real Prometheus. Run from the repository root:
`python3 hack/dashboard.py`. A test fails when the committed JSON differs.
"""
import json
import pathlib
import sys

SEL = 'namespace=~"$namespace", datastage=~"$datastage"'
RATE = "$__rate_interval"

# (title, unit, kind, width, [(legend, expr)], description)
ROWS = [
    ("Transfers", [
        ("Throughput per DataStage", "Bps", "timeseries", 12,
         [("{{namespace}}/{{datastage}} {{direction}}",
           f'sum by (namespace, datastage, direction) (rate(ferry_stager_transferred_bytes_total{{{SEL}}}[{RATE}]))')],
         "Bytes per second written to their destination by all workers of a DataStage."),
        ("Throughput per node", "Bps", "timeseries", 12,
         [("{{node}}", f'sum by (node) (rate(ferry_stager_transferred_bytes_total{{{SEL}}}[{RATE}]))')],
         "Bytes per second moved by the stager pods on each node."),
        ("Progress", "percentunit", "bargauge", 8,
         [("{{namespace}}/{{datastage}}",
           f'max by (namespace, datastage) (ferry_operator_datastage_bytes{{{SEL}, state="done"}})'
           f' / max by (namespace, datastage) (ferry_operator_datastage_bytes{{{SEL}, state="total"}} > 0)')],
         "Bytes in place over bytes selected, as the operator reports in status.totals."),
        ("Bytes staged", "bytes", "stat", 8,
         [("{{namespace}}/{{datastage}}",
           f'max by (namespace, datastage) (ferry_operator_datastage_bytes{{{SEL}, state="done"}})')],
         "Bytes in place per DataStage, summed over its workers (nodes or shards)."),
        ("Objects staged", "short", "stat", 8,
         [("{{namespace}}/{{datastage}}",
           f'max by (namespace, datastage) (ferry_operator_datastage_objects{{{SEL}, state="done"}})')],
         "Objects in place per DataStage."),
        ("Objects per second by result", "ops", "timeseries", 12,
         [("{{result}}", f'sum by (result) (rate(ferry_stager_objects_total{{{SEL}}}[{RATE}]))')],
         "Objects finished by the stagers: transferred, skipped (already staged), failed, refused (unsafe key)."),
        ("Store request latency (p50, p99)", "s", "timeseries", 12,
         [("p50 {{operation}}", f'histogram_quantile(0.5, sum by (le, operation) (rate(ferry_stager_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))'),
          ("p99 {{operation}}", f'histogram_quantile(0.99, sum by (le, operation) (rate(ferry_stager_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))')],
         "Duration of store requests including the body, by operation."),
        ("Requests in flight and the concurrency limit", "short", "timeseries", 24,
         [("in flight {{worker}}", f'sum by (worker) (ferry_stager_requests_in_flight{{{SEL}}})'),
          ("limit {{worker}}", f'max by (worker) (ferry_stager_concurrency_limit{{{SEL}}})')],
         "Store requests holding a slot, and how many each worker allows (with --concurrency auto, what it chose"
         " from the throughput it measured), per worker."),
    ]),
    ("Fleet staging", [
        ("Object-store egress saved", "Bps", "timeseries", 12,
         [("{{namespace}}/{{datastage}} received from peers",
           f'sum by (namespace, datastage) (rate(ferry_stager_peer_bytes_total{{{SEL}, direction="received"}}[{RATE}]))'),
          ("{{namespace}}/{{datastage}} served to peers",
           f'sum by (namespace, datastage) (rate(ferry_stager_peer_bytes_total{{{SEL}, direction="served"}}[{RATE}]))')],
         "Bytes per second the workers of a PeerToPeer DataStage received from each other instead of reading"
         " them from the object store (each verified against the store's checksum), and served to each other."),
        ("Object-store egress saved (run)", "bytes", "stat", 6,
         [("{{namespace}}/{{datastage}}",
           f'max by (namespace, datastage) (ferry_operator_datastage_bytes{{{SEL}, state="from_peers"}})')],
         "Bytes the current run's workers received from peers instead of the store: status.totals.bytesFromPeers,"
         " cumulative over the run and kept after the workers exit."),
        ("Peer failures", "ops", "timeseries", 6,
         [("{{namespace}}/{{datastage}}",
           f'sum by (namespace, datastage) (rate(ferry_stager_peer_failures_total{{{SEL}}}[{RATE}]))')],
         "Peers the workers stopped asking (unreachable, stalled, or serving bytes that did not match the store's"
         " checksum); their share was read from the store."),
    ]),
    ("Store budgets", [
        ("Budget share per worker", "reqps", "timeseries", 8,
         [("{{budget}} (StoreBudget)", 'max by (budget) (ferry_operator_store_budget{state="share_requests_per_second"})'),
          ("{{worker}} follows", f'max by (worker) (ferry_stager_store_share_requests_per_second{{{SEL}}})'),
          ("{{worker}} cap in force", f'max by (worker) (ferry_stager_request_rate_cap{{{SEL}}})')],
         "Requests per second each worker may send under its bucket's StoreBudget, as the operator split it and"
         " as each worker follows it (0: no budget caps requests); and the cap in force, the lowest of the share,"
         " --max-request-rate and the rate the store's refusals taught the worker (0: none)."),
        ("Workers sharing each budget", "short", "timeseries", 8,
         [("{{budget}}", 'max by (budget) (ferry_operator_store_budget{state="workers"})')],
         "Workers running against each budgeted bucket: the operator splits the budget equally among them."),
        ("Throttled requests", "reqps", "timeseries", 8,
         [("{{namespace}}/{{datastage}}",
           f'sum by (namespace, datastage) (rate(ferry_stager_retries_total{{{SEL}, reason="throttled"}}[{RATE}]))'),
          ("{{budget}} (reported, run)", 'max by (budget) (ferry_operator_store_budget{state="throttled_requests"})')],
         "Requests the store answered with SlowDown, 429 or 503, per second per DataStage; and the count the"
         " workers of each budget's DataStages reported in their current runs."),
    ]),
    ("Errors", [
        ("Retries by reason", "ops", "timeseries", 8,
         [("{{reason}}", f'sum by (reason) (rate(ferry_stager_retries_total{{{SEL}}}[{RATE}]))')],
         "Store requests retried: throttled, server_error, timeout, connection, truncated_body, checksum_mismatch."),
        ("Failed and refused objects", "ops", "timeseries", 8,
         [("{{result}}", f'sum by (result) (rate(ferry_stager_objects_total{{{SEL}, result=~"failed|refused"}}[{RATE}]))')],
         "Objects that failed after retries, or were refused before any byte moved."),
        ("Reconcile errors by reason", "ops", "timeseries", 8,
         [("{{reason}}", f'sum by (reason) (rate(ferry_operator_reconcile_errors_total[{RATE}]))')],
         "Failed reconciliations by the API's reason: Forbidden means the operator's RBAC is short."),
    ]),
    ("Operator", [
        ("Reconcile rate", "ops", "timeseries", 8,
         [("{{result}}", f'sum by (result) (rate(ferry_operator_reconciles_total[{RATE}]))')],
         "Reconciliations per second by result."),
        ("Reconcile latency (p50, p99)", "s", "timeseries", 8,
         [("p50", f'histogram_quantile(0.5, sum by (le) (rate(ferry_operator_reconcile_duration_seconds_bucket[{RATE}])))'),
          ("p99", f'histogram_quantile(0.99, sum by (le) (rate(ferry_operator_reconcile_duration_seconds_bucket[{RATE}])))')],
         "Time spent in one reconciliation."),
        ("DataStages by phase", "short", "bargauge", 8,
         [("{{phase}}", 'max by (phase) (ferry_operator_datastages)')],
         "DataStages known to the leading operator, by phase."),
    ]),
]


def dashboard():
    panels, next_id, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": next_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id, y, x = next_id + 1, y + 1, 0
        for title, unit, kind, width, targets, description in row_panels:
            if x + width > 24:
                x, y = 0, y + 8
            panel = {
                "id": next_id, "type": kind, "title": title, "description": description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
                if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"], "values": False}},
                "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for i, (legend, expr) in enumerate(targets)],
            }
            if unit == "percentunit":
                panel["fieldConfig"]["defaults"].update({"min": 0, "max": 1})
            panels.append(panel)
            next_id, x = next_id + 1, x + width
        y += 8

    def variable(name, label, query):
        return {"name": name, "label": label, "type": "query", "query": {"query": query, "refId": name},
                "definition": query, "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}

    return {
        "title": "Ferry", "uid": "ferry-overview", "description": "DataStages, stager throughput and operator health",
        "tags": ["ferry", "kubernetes", "storage"], "timezone": "browser", "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("namespace", "Namespace", "label_values(ferry_operator_datastage_bytes, namespace)"),
            variable("datastage", "DataStage",
                     'label_values(ferry_operator_datastage_bytes{namespace=~"$namespace"}, datastage)'),
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parent.parent
    out = root / "charts" / "ferry" / "dashboards" / "ferry.json"
    text = json.dumps(dashboard(), indent=2) + "\n"
    if sys.argv[1:] == ["--check"]:
        if out.read_text() != text:
            sys.exit(f"{out.relative_to(root)} is out of date: run python3 hack/dashboard.py")
    else:
        out.write_text(text)
        print(f"wrote {out.relative_to(root)}")

"""Writes grafana-dashboard.json (the stator Grafana dashboard, from the panels below) and
prometheusrule.yaml (alerts.rules.yaml's groups wrapped for the Prometheus Operator).

    python deploy/monitoring/generate.py   # after editing a panel or a rule; CI checks they agree

Every query here is evaluated against a real Prometheus scraping a real frontend and mocker
workers in tests/deploy/test_prometheus.py: each must return data. Series labels follow
the scrape jobs of podmonitor.yaml / servicemonitor.yaml (job="stator-frontend",
job="stator-worker"); in Kubernetes `pod` tells workers apart, here `instance` does.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
DASHBOARD = HERE / "grafana-dashboard.json"
RULES = HERE / "alerts.rules.yaml"
PROMETHEUS_RULE = HERE / "prometheusrule.yaml"


def quantiles(metric: str, by: str = "model") -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[$__rate_interval])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.9, 0.99)
    ]


# (row title, [(panel title, unit, [(query, legend), ...]), ...])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Frontend",
        [
            (
                "Requests by status",
                "reqps",
                [
                    (
                        'sum by (status) (rate(stator_frontend_requests_total{endpoint=~"/v1/.*"}[$__rate_interval]))',
                        "{{status}}",
                    )
                ],
            ),
            (
                "Errors by status (4xx and 5xx)",
                "reqps",
                [
                    (
                        'sum by (status, endpoint) (rate(stator_frontend_requests_total{status=~"[45].."}[$__rate_interval]))',
                        "{{status}} {{endpoint}}",
                    )
                ],
            ),
            (
                "Error ratio (5xx)",
                "percentunit",
                [("stator:frontend_error_ratio:rate5m", "5xx / all")],
            ),
            (
                "Time to first token",
                "s",
                quantiles("stator_frontend_time_to_first_token_seconds"),
            ),
            (
                "Inter-token latency",
                "s",
                quantiles("stator_frontend_inter_token_latency_seconds"),
            ),
            (
                "Request duration",
                "s",
                quantiles("stator_frontend_request_duration_seconds"),
            ),
            (
                "In-flight requests",
                "short",
                [("sum by (model) (stator_frontend_inflight_requests)", "{{model}}")],
            ),
            (
                "Tokens per second",
                "short",
                [
                    (
                        "sum by (model) (rate(stator_frontend_input_tokens_sum[$__rate_interval]))",
                        "input {{model}}",
                    ),
                    (
                        "sum by (model) (rate(stator_frontend_output_tokens_sum[$__rate_interval]))",
                        "output {{model}}",
                    ),
                ],
            ),
            (
                "TTFT SLO: share of requests over the target (alerts: StatorTTFTSLOBurn)",
                "percentunit",
                [
                    ("stator:ttft_slo_miss_ratio:rate5m", "5m"),
                    ("stator:ttft_slo_miss_ratio:rate1h", "1h"),
                ],
            ),
        ],
    ),
    (
        "Router",
        [
            (
                "Routing decisions",
                "reqps",
                [
                    (
                        "sum by (model, policy) (rate(stator_router_decisions_total[$__rate_interval]))",
                        "{{policy}} {{model}}",
                    )
                ],
            ),
            (
                "KV cache hit rate",
                "percentunit",
                [
                    (
                        "sum by (model) (rate(stator_router_predicted_hit_rate_sum[$__rate_interval]))"
                        " / sum by (model) (rate(stator_router_predicted_hit_rate_count[$__rate_interval]))",
                        "predicted by the router {{model}}",
                    ),
                    (
                        "sum by (model) (rate(stator_frontend_cached_tokens_total[$__rate_interval]))"
                        " / sum by (model) (rate(stator_frontend_input_tokens_sum[$__rate_interval]))",
                        "served from prefix caches {{model}}",
                    ),
                ],
            ),
            (
                "Queue (all workers busy)",
                "short",
                [("sum by (model) (stator_router_queue_length)", "{{model}}")],
            ),
            (
                "Routing time",
                "s",
                quantiles("stator_router_routing_seconds"),
            ),
        ],
    ),
    (
        "Disaggregation",
        [
            (
                "Where prompts are computed",
                "reqps",
                [
                    (
                        "sum by (path, reason) (rate(stator_router_disagg_requests_total[$__rate_interval]))",
                        "{{path}}: {{reason}}",
                    )
                ],
            ),
            (
                "Prefill pool",
                "short",
                [
                    ("max by (model) (stator_router_prefill_workers)", "prefill workers {{model}}"),
                    (
                        "max by (model) (stator_router_prefill_queue_tokens)",
                        "queued prompt tokens {{model}}",
                    ),
                ],
            ),
        ],
    ),
    (
        "Workers",
        [
            (
                "Workers serving",
                "short",
                [("count by (model) (stator_worker_uptime_seconds)", "{{model}}")],
            ),
            (
                "KV cache usage",
                "percentunit",
                [("max by (model, instance) (stator_worker_kv_usage)", "{{instance}}")],
            ),
            (
                "Batch: running and waiting requests",
                "short",
                [
                    (
                        "sum by (instance) (stator_worker_running_requests)",
                        "running {{instance}}",
                    ),
                    (
                        "sum by (instance) (stator_worker_waiting_requests)",
                        "waiting {{instance}}",
                    ),
                ],
            ),
            (
                "Preemptions",
                "short",
                [
                    (
                        "sum by (instance) (rate(stator_worker_preemptions_total[$__rate_interval]))",
                        "{{instance}}",
                    )
                ],
            ),
            (
                "Worker requests and errors",
                "reqps",
                [
                    (
                        "sum by (instance) (rate(stator_worker_requests_total[$__rate_interval]))",
                        "requests {{instance}}",
                    ),
                    (
                        "sum by (instance) (rate(stator_worker_errors_total[$__rate_interval]))",
                        "errors {{instance}}",
                    ),
                ],
            ),
        ],
    ),
]


def queries() -> list[str]:
    """Every PromQL expression of the dashboard, in panel order."""
    return [expr for _, panels in ROWS for _, _, targets in panels for expr, _ in targets]


def dashboard() -> dict:
    panels: list[dict] = []
    y = 0
    next_id = 1
    for row, row_panels in ROWS:
        panels.append(
            {
                "type": "row",
                "title": row,
                "id": next_id,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        for i, (title, unit, targets) in enumerate(row_panels):
            panels.append(
                {
                    "type": "timeseries",
                    "title": title,
                    "id": next_id,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {
                            "refId": chr(ord("A") + k),
                            "expr": expr,
                            "legendFormat": legend,
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        }
                        for k, (expr, legend) in enumerate(targets)
                    ],
                }
            )
            next_id += 1
        y += ((len(row_panels) + 2) // 3) * 8
    return {
        "title": "stator",
        "uid": "stator-overview",
        "tags": ["stator", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Prometheus",
                    "query": "prometheus",
                }
            ]
        },
        "panels": panels,
    }


def render_dashboard() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def render_prometheus_rule() -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "stator",
            "labels": {"app.kubernetes.io/name": "stator", "release": "prometheus"},
        },
        "spec": {"groups": yaml.safe_load(RULES.read_text())["groups"]},
    }
    head = (
        "# GENERATED by generate.py from alerts.rules.yaml (the same groups, for the Prometheus\n"
        "# Operator; CI checks that they agree). Prometheus picks it up when its ruleSelector\n"
        "# matches these labels.\n"
    )
    return head + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100)


if __name__ == "__main__":
    DASHBOARD.write_text(render_dashboard())
    PROMETHEUS_RULE.write_text(render_prometheus_rule())
    print(f"wrote {DASHBOARD} and {PROMETHEUS_RULE}")

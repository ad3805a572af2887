"""Prometheus metrics, one registry per app (so several apps can live in one process)."""
from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

SOLVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120)
PUBLISH_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.plan_version = Gauge("recycle_plan_version", "current plan version", ["job"],
                                  registry=r)
        self.plans_published = Counter("recycle_plans_published_total",
                                       "plan versions published", ["cause"], registry=r)
        self.solve_seconds = Histogram("recycle_solve_seconds", "wall time of one solve",
                                       ["solver", "purpose"], buckets=SOLVE_BUCKETS, registry=r)
        self.event_to_plan_seconds = Histogram(
            "recycle_event_to_plan_seconds", "failure/recovery event received to new plan "
            "version published", buckets=PUBLISH_BUCKETS, registry=r)
        self.cache_hits = Counter("recycle_plan_cache_hits_total",
                                  "events answered from the plan cache", registry=r)
        self.cache_misses = Counter("recycle_plan_cache_misses_total",
                                    "events that had to be solved on the spot", registry=r)
        self.events = Counter("recycle_events_total", "failure, recovery and speed events",
                              ["kind", "source", "outcome"], registry=r)
        self.heartbeats = Counter("recycle_heartbeats_total", "heartbeats received", registry=r)
        self.heartbeats_missed = Counter("recycle_heartbeats_missed_total",
                                         "workers declared failed for missing heartbeats",
                                         registry=r)
        self.suspects = Counter("recycle_suspect_reports_total", "suspect reports", registry=r)
        self.waiters = Gauge("recycle_longpoll_waiters", "long-poll requests waiting",
                             registry=r)
        self.slow_workers = Gauge("recycle_slow_workers", "workers whose speed in force is "
                                  "below 1.0 (stragglers), per job", ["job"], registry=r)
        self.jobs = Gauge("recycle_jobs", "jobs by state", ["state"], registry=r)
        self.precompute_done = Gauge("recycle_precompute_done", "precompute solves done",
                                     ["job"], registry=r)
        self.precompute_total = Gauge("recycle_precompute_total", "precompute solves planned",
                                      ["job"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

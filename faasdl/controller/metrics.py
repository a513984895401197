"""The controller's Prometheus metrics, in a registry of its own (one per controller, so that
tests and several controllers in one process do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: Upper bounds of the activation-duration buckets: aggregations take a fraction of a second,
#: a training activation up to the platform's longest time limit (OpenWhisk's default: 5
#: minutes; prometheus_client's default buckets end at 10 s).
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs_submitted = Counter(
            "faasdl_jobs_submitted", "Jobs accepted.", ["tenant"], registry=self.registry
        )
        self.jobs_finished = Counter(
            "faasdl_jobs_finished", "Jobs that ended, by state.", ["state"], registry=self.registry
        )
        self.jobs = Gauge("faasdl_jobs", "Jobs by state.", ["state"], registry=self.registry)
        self.activations = Counter(
            "faasdl_activations",
            "Activations the controller started and saw end, by kind and outcome.",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.activation_seconds = Histogram(
            "faasdl_activation_duration_seconds",
            "Duration of activations, by kind.",
            ["kind"],
            registry=self.registry,
            buckets=DURATION_BUCKETS_S,
        )
        self.gb_seconds = Counter(
            "faasdl_activation_gb_seconds", "Memory × time billed.", registry=self.registry
        )
        self.cost = Counter("faasdl_cost_usd", "GB·s × price.", registry=self.registry)
        self.paused = Gauge(
            "faasdl_jobs_paused",
            "Running jobs whose runner waits for the platform to answer (it could not be "
            "reached); what they have done is kept in the store.",
            registry=self.registry,
        )
        self.recoveries = Counter(
            "faasdl_recoveries",
            "Units run again after a failure.",
            ["kind"],
            registry=self.registry,
        )

        self.housekept = Counter(
            "faasdl_housekeeping_deleted",
            "What housekeeping deleted: jobs past their retention (expired_jobs), blobs of ended "
            "jobs (ended_job_blobs), chunks and spill files of writes that never published "
            "(unpublished_pieces), temporary files of uploads cut short (upload_partials).",
            ["what"],
            registry=self.registry,
        )
        self.housekeeping_done = Gauge(
            "faasdl_housekeeping_last_pass_timestamp_seconds",
            "When the last housekeeping pass that ran to its end ended (Unix time).",
            registry=self.registry,
        )
        self.admission_done = Gauge(
            "faasdl_admission_last_pass_timestamp_seconds",
            "When the last admission pass ended (Unix time): one every "
            "FAASDL_CONTROLLER__SCHEDULER_TICK_S while the store answers.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""The plan of a deploy and of a teardown: each step looks at what exists and changes only
what differs, so a second run changes nothing."""

from __future__ import annotations

from pathlib import Path

from tasklease.deploy.config import Config, Queue
from tasklease.deploy.databases import (
    STORE_APIS,
    ensure_database,
    grant_store,
    teardown_store,
    worker_flags,
)
from tasklease.deploy.errors import DeployError
from tasklease.deploy.gcloud import Gcloud
from tasklease.deploy.iam import Grants
from tasklease.deploy.settings import JobSettings, QueueSettings
from tasklease.deploy.source import digest
from tasklease.jobs import Job

APIS = (
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudtasks.googleapis.com",
    "cloudscheduler.googleapis.com",
)
DIGEST_LABEL = "tasklease-digest"


class Deployer:
    """Deploys ``config`` with ``gcloud``, building the worker from ``source`` (the directory
    sent to Cloud Build by ``run deploy --source``), or tears it down."""

    def __init__(self, config: Config, gcloud: Gcloud, source: Path) -> None:
        self.config = config
        self.gcloud = gcloud
        self.source = source
        self.project_flag = f"--project={config.project}"
        self.grants = Grants(config, gcloud)

    def deploy(self) -> None:
        config, grants = self.config, self.grants
        self.enable_apis()
        ensure_database(config, self.gcloud)
        self.service_accounts()
        grant_store(config, grants)
        for queue in config.queues:
            self.queue(queue)
            for member in self.enqueuers():
                grants.on_queue(queue, member)
        for member in self.enqueuers():
            # actAs the invoker, to create tasks that carry its OIDC token: on that account only.
            grants.on_account(config.invoker_email, member, "roles/iam.serviceAccountUser")
        url = self.worker()
        grants.on_service(f"serviceAccount:{config.invoker_email}", "roles/run.invoker")
        grants.for_proxies()  # Before the jobs, so a proxy job's first run may start its target.
        for job in config.jobs:
            self.job(job, url)
        print(
            f"\nworker: {url}\nverify: gcloud run services describe {config.service} "
            f"--region={config.region} {self.project_flag}"
        )

    def teardown(self) -> None:
        config = self.config
        location, region = f"--location={config.region}", f"--region={config.region}"
        for job in config.jobs:
            self.delete_if_present(("scheduler", "jobs"), job.name, location)
        for queue in config.queues:
            self.delete_if_present(("tasks", "queues"), queue.name, location)
        self.delete_if_present(("run", "services"), config.service, region)
        kept = teardown_store(config, self.gcloud)
        for email in (config.worker_email, config.invoker_email):
            self.delete_if_present(("iam", "service-accounts"), email)
        self.grants.revoke_for_proxies()
        print(f"kept: {kept}, and the enabled APIs")

    def delete_if_present(self, kind: tuple[str, str], name: str, *where: str) -> None:
        if self.gcloud.read(*kind, "describe", name, *where, self.project_flag) is not None:
            self.gcloud.change(*kind, "delete", name, *where, self.project_flag, "--quiet")

    def enqueuers(self) -> list[str]:
        members = [f"serviceAccount:{self.config.worker_email}"] if self.config.fan_out else []
        return members + list(self.config.enqueuers)

    def enable_apis(self) -> None:
        enabled = self.gcloud.read("services", "list", "--enabled", self.project_flag) or []
        names = {service.get("config", {}).get("name") for service in enabled}
        wanted = (*APIS, *STORE_APIS[self.config.store])
        missing = [api for api in wanted if api not in names]
        if missing:
            self.gcloud.change("services", "enable", *missing, self.project_flag)
        else:
            self.gcloud.unchanged("APIs")

    def service_accounts(self) -> None:
        config, gcloud, project = self.config, self.gcloud, self.project_flag
        for name, email, title in [
            (config.worker_account, config.worker_email, "tasklease worker runtime"),
            (config.invoker_account, config.invoker_email, "tasklease invoker (OIDC tokens)"),
        ]:
            if gcloud.read("iam", "service-accounts", "describe", email, project) is None:
                gcloud.change(
                    "iam", "service-accounts", "create", name, f"--display-name={title}", project
                )
            else:
                gcloud.unchanged(f"service account {email}")

    def queue(self, queue: Queue) -> None:
        gcloud, project = self.gcloud, self.project_flag
        location = f"--location={self.config.region}"
        wanted = QueueSettings.wanted(queue)
        flags = wanted.flags()
        current = gcloud.read("tasks", "queues", "describe", queue.name, location, project)
        if current is None:
            gcloud.change("tasks", "queues", "create", queue.name, location, *flags, project)
        elif QueueSettings.described(current) != wanted:
            gcloud.change("tasks", "queues", "update", queue.name, location, *flags, project)
        else:
            gcloud.unchanged(f"queue {queue.name}")

    def worker(self) -> str:
        """Deploy the service unless the same source and settings are already live."""
        config, gcloud, project = self.config, self.gcloud, self.project_flag
        number = "PROJECT_NUMBER"
        if not gcloud.dry_run:
            described = gcloud.read("projects", "describe", config.project) or {}
            number = str(described.get("projectNumber", ""))
            if not number.isdigit() or not number.isascii():
                raise DeployError(f"gcloud gave {number!r} as the project number")
        url = f"https://{config.service}-{number}.{config.region}.run.app"
        flags = [
            f"--region={config.region}",
            f"--service-account={config.worker_email}",
            "--no-allow-unauthenticated",
            f"--timeout={config.request_timeout:g}",
            f"--concurrency={config.workers * config.threads}",
            f"--min-instances={config.min_instances}",
            f"--max-instances={config.max_instances}",
            # A delimiter that cannot occur in the values (the store URL holds '&' and ',').
            "--set-env-vars=^|^" + "|".join(f"{k}={v}" for k, v in worker_env(config, url).items()),
            *worker_flags(config),
        ]
        wanted = digest(flags, self.source)
        current = gcloud.read(
            "run", "services", "describe", config.service, f"--region={config.region}", project
        )
        labels = (current or {}).get("metadata", {}).get("labels", {})
        if current is not None and labels.get(DIGEST_LABEL) == wanted:
            gcloud.unchanged(f"Cloud Run service {config.service} (same source and settings)")
            return url
        gcloud.change(
            "run",
            "deploy",
            config.service,
            f"--source={self.source}",
            *flags,
            f"--labels={DIGEST_LABEL}={wanted}",
            project,
            "--quiet",
        )
        return url

    def job(self, job: Job, url: str) -> None:
        gcloud, project = self.gcloud, self.project_flag
        location = f"--location={self.config.region}"
        wanted = JobSettings.wanted(job, url, self.config.invoker_email)
        flags = wanted.flags()
        current = gcloud.read("scheduler", "jobs", "describe", job.name, location, project)
        if current is None:
            gcloud.change(
                "scheduler", "jobs", "create", "http", job.name, location, *flags, project
            )
        elif JobSettings.described(current) != wanted:
            gcloud.change(
                "scheduler", "jobs", "update", "http", job.name, location, *flags, project
            )
        else:
            gcloud.unchanged(f"scheduler job {job.name}")


def worker_env(config: Config, url: str) -> dict[str, str]:
    """The worker's environment: the store (``Config.store_url``), OIDC with the invoker as
    the only allowed caller and the service URL as the audience, the first queue for fan-out,
    gunicorn's sizes."""
    queue = config.queues[0]
    return {
        "TASKLEASE_ROUTER": config.router,
        "TASKLEASE_STORE": config.store_url,
        "TASKLEASE_AUTH": "oidc",
        "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": config.invoker_email,
        "TASKLEASE_AUDIENCE": url,
        "GOOGLE_CLOUD_PROJECT": config.project,
        "TASKLEASE_PROJECT": config.project,
        "TASKLEASE_LOCATION": config.region,
        "TASKLEASE_QUEUE": queue.name,
        "TASKLEASE_WORKER_URL": url,
        "TASKLEASE_SERVICE_ACCOUNT": config.invoker_email,
        "TASKLEASE_DISPATCH_DEADLINE": f"{queue.dispatch_deadline:g}",
        "WEB_CONCURRENCY": str(config.workers),
        "GUNICORN_THREADS": str(config.threads),
        "GUNICORN_TIMEOUT": f"{config.gunicorn_timeout:g}",
        **({"TASKLEASE_ASGI_THREADS": str(config.threads)} if config.server == "uvicorn" else {}),
    }

#!/usr/bin/env python3
"""From zero to a running tasklease worker on Cloud Run, in one command.

    deploy/deploy.py [--config deploy/tasklease.toml] [--dry-run] [--teardown]

Reads one TOML file (see deploy/tasklease.toml) and, with the gcloud CLI: enables the APIs,
creates the Firestore database with a TTL policy on the runs' expire_at and the indexes the
run listings need, the two service accounts (the worker's runtime identity, and the
invoker that Cloud Tasks and Scheduler put in their OIDC tokens), the queues, the worker on
Cloud Run from source (private: --no-allow-unauthenticated) and the Scheduler jobs, granting
each identity only what it needs, on the narrowest resource that takes the grant.

Every step first looks at what exists and changes only what differs, so a second run changes
nothing. --dry-run prints every command, in order, and runs none (not even the look-ups: it
plans as for an empty project). Needs only Python 3.11+ and gcloud.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# Run as a script from a checkout (deploy/deploy.py), the source defaults to that checkout.
ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    # A script's own directory is sys.path[0] (Python docs, "sys.path"): there, this kit's
    # modules (config, gcloud, ...) would pass for top-level ones. tasklease itself is
    # importable in every install; a bare checkout gets its root on the path.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    if importlib.util.find_spec("tasklease") is None:
        sys.path.insert(0, str(ROOT))

from tasklease.deploy.config import DEFAULT_CONFIG, Config, Job, Queue, load_config  # noqa: E402
from tasklease.deploy.errors import DeployError  # noqa: E402
from tasklease.deploy.gcloud import Gcloud, has_binding  # noqa: E402
from tasklease.deploy.proxies import PROXY_GRANTS, Proxy  # noqa: E402
from tasklease.deploy.settings import JobSettings, QueueSettings  # noqa: E402
from tasklease.deploy.source import (  # noqa: E402
    check_proxy_source,
    check_source,
    ensure_procfile,
)
from tasklease.deploy.source import digest as source_digest  # noqa: E402

APIS = (
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudtasks.googleapis.com",
    "cloudscheduler.googleapis.com",
    "firestore.googleapis.com",
)
DIGEST_LABEL = "tasklease-digest"


class Deployer:
    def __init__(self, config: Config, gcloud: Gcloud, source: Path = ROOT) -> None:
        self.c = config
        self.g = gcloud
        self.source = source  # The directory sent to Cloud Build (`run deploy --source`).
        self.p = f"--project={config.project}"

    def deploy(self) -> None:
        self.enable_apis()
        self.firestore()
        self.service_accounts()
        self.grant_project_role(f"serviceAccount:{self.c.worker_email}", "roles/datastore.user")
        for queue in self.c.queues:
            self.queue(queue)
            for member in self.enqueuers():
                self.grant_on_queue(queue, member)
        for member in self.enqueuers():
            # actAs the invoker, to create tasks that carry its OIDC token: on that account only.
            self.grant_on_account(self.c.invoker_email, member, "roles/iam.serviceAccountUser")
        url = self.worker()
        self.grant_on_service(f"serviceAccount:{self.c.invoker_email}", "roles/run.invoker")
        self.proxy_grants()  # Before the jobs, so a proxy job's first run may start its target.
        for job in self.c.jobs:
            self.job(job, url)
        print(
            f"\nworker: {url}\nverify: gcloud run services describe {self.c.service} "
            f"--region={self.c.region} {self.p}"
        )

    def teardown(self) -> None:
        location = f"--location={self.c.region}"
        for job in self.c.jobs:
            if self.g.read("scheduler", "jobs", "describe", job.name, location, self.p) is not None:
                self.g.change("scheduler", "jobs", "delete", job.name, location, self.p, "--quiet")
        for queue in self.c.queues:
            if self.g.read("tasks", "queues", "describe", queue.name, location, self.p) is not None:
                self.g.change("tasks", "queues", "delete", queue.name, location, self.p, "--quiet")
        region = f"--region={self.c.region}"
        if self.g.read("run", "services", "describe", self.c.service, region, self.p) is not None:
            self.g.change("run", "services", "delete", self.c.service, region, self.p, "--quiet")
        self.g.change(
            "projects",
            "remove-iam-policy-binding",
            self.c.project,
            f"--member=serviceAccount:{self.c.worker_email}",
            "--role=roles/datastore.user",
            "--condition=None",
        )
        for email in (self.c.worker_email, self.c.invoker_email):
            if self.g.read("iam", "service-accounts", "describe", email, self.p) is not None:
                self.g.change("iam", "service-accounts", "delete", email, self.p, "--quiet")
        self.proxy_teardown()
        print(f"kept: the Firestore database {self.c.database} and its data, and the enabled APIs")

    def enqueuers(self) -> list[str]:
        members = [f"serviceAccount:{self.c.worker_email}"] if self.c.fan_out else []
        return members + list(self.c.enqueuers)

    def enable_apis(self) -> None:
        enabled = self.g.read("services", "list", "--enabled", self.p) or []
        names = {service.get("config", {}).get("name") for service in enabled}
        missing = [api for api in APIS if api not in names]
        if missing:
            self.g.change("services", "enable", *missing, self.p)
        else:
            self.g.unchanged("APIs")

    def firestore(self) -> None:
        database = f"--database={self.c.database}"
        if self.g.read("firestore", "databases", "describe", database, self.p) is None:
            self.g.change(
                "firestore",
                "databases",
                "create",
                database,
                f"--location={self.c.firestore_location}",
                "--type=firestore-native",
                self.p,
            )
        else:
            self.g.unchanged(f"Firestore database {self.c.database}")
        group = f"--collection-group={self.c.collection}"
        ttl = self.g.read("firestore", "fields", "ttls", "list", group, database, self.p) or []
        if not any(
            str(entry.get("name", "")).endswith("/fields/expire_at")
            and entry.get("ttlConfig", {}).get("state") in ("ACTIVE", "CREATING")
            for entry in ttl
        ):
            self.g.change(
                "firestore",
                "fields",
                "ttls",
                "update",
                "expire_at",
                group,
                "--enable-ttl",
                database,
                self.p,
                "--async",
            )
        else:
            self.g.unchanged("TTL policy on expire_at")
        indexes = self.g.read("firestore", "indexes", "composite", "list", database, self.p) or []
        # Listing runs newest first, by status (the dead-letter listing, `tasklease runs`) or by
        # handler (`tasklease runs list --handler`): one equality field, then claimed_at.
        for first in ("status", "handler"):
            wanted = [(first, "ASCENDING"), ("claimed_at", "DESCENDING")]
            if not any(
                f"/collectionGroups/{self.c.collection}/" in index.get("name", "")
                and [(f.get("fieldPath"), f.get("order")) for f in index.get("fields", [])][:2]
                == wanted
                for index in indexes
            ):
                self.g.change(
                    "firestore",
                    "indexes",
                    "composite",
                    "create",
                    group,
                    f"--field-config=field-path={first},order=ascending",
                    "--field-config=field-path=claimed_at,order=descending",
                    database,
                    self.p,
                    "--async",
                )
            else:
                self.g.unchanged(f"index on {first} + claimed_at")

    def service_accounts(self) -> None:
        for name, email, title in [
            (self.c.worker_account, self.c.worker_email, "tasklease worker runtime"),
            (self.c.invoker_account, self.c.invoker_email, "tasklease invoker (OIDC tokens)"),
        ]:
            if self.g.read("iam", "service-accounts", "describe", email, self.p) is None:
                self.g.change(
                    "iam", "service-accounts", "create", name, f"--display-name={title}", self.p
                )
            else:
                self.g.unchanged(f"service account {email}")

    def queue(self, queue: Queue) -> None:
        location = f"--location={self.c.region}"
        wanted = QueueSettings.wanted(queue)
        flags = wanted.flags()
        current = self.g.read("tasks", "queues", "describe", queue.name, location, self.p)
        if current is None:
            self.g.change("tasks", "queues", "create", queue.name, location, *flags, self.p)
        elif QueueSettings.described(current) != wanted:
            self.g.change("tasks", "queues", "update", queue.name, location, *flags, self.p)
        else:
            self.g.unchanged(f"queue {queue.name}")

    def worker(self) -> str:
        """Deploy the service unless the same source and settings are already live."""
        number = "PROJECT_NUMBER"
        if not self.g.dry_run:
            described = self.g.read("projects", "describe", self.c.project) or {}
            number = str(described.get("projectNumber", ""))
            if not number.isdigit() or not number.isascii():
                raise DeployError(f"gcloud gave {number!r} as the project number")
        url = f"https://{self.c.service}-{number}.{self.c.region}.run.app"
        queue = self.c.queues[0]
        env = {
            "TASKLEASE_ROUTER": self.c.router,
            "TASKLEASE_STORE": f"firestore://?collection={self.c.collection}&database={self.c.database}",
            "TASKLEASE_AUTH": "oidc",
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": self.c.invoker_email,
            "TASKLEASE_AUDIENCE": url,
            "GOOGLE_CLOUD_PROJECT": self.c.project,
            "TASKLEASE_PROJECT": self.c.project,
            "TASKLEASE_LOCATION": self.c.region,
            "TASKLEASE_QUEUE": queue.name,
            "TASKLEASE_WORKER_URL": url,
            "TASKLEASE_SERVICE_ACCOUNT": self.c.invoker_email,
            "TASKLEASE_DISPATCH_DEADLINE": f"{queue.dispatch_deadline:g}",
            "WEB_CONCURRENCY": str(self.c.workers),
            "GUNICORN_THREADS": str(self.c.threads),
            "GUNICORN_TIMEOUT": f"{self.c.gunicorn_timeout:g}",
        }
        flags = [
            f"--region={self.c.region}",
            f"--service-account={self.c.worker_email}",
            "--no-allow-unauthenticated",
            f"--timeout={self.c.request_timeout:g}",
            f"--concurrency={self.c.workers * self.c.threads}",
            f"--min-instances={self.c.min_instances}",
            f"--max-instances={self.c.max_instances}",
            # A delimiter that cannot occur in the values (the store URL holds '&' and ',').
            "--set-env-vars=^|^" + "|".join(f"{k}={v}" for k, v in env.items()),
        ]
        digest = source_digest(flags, self.source)
        current = self.g.read(
            "run", "services", "describe", self.c.service, f"--region={self.c.region}", self.p
        )
        labels = (current or {}).get("metadata", {}).get("labels", {})
        if current is not None and labels.get(DIGEST_LABEL) == digest:
            self.g.unchanged(f"Cloud Run service {self.c.service} (same source and settings)")
            return url
        self.g.change(
            "run",
            "deploy",
            self.c.service,
            f"--source={self.source}",
            *flags,
            f"--labels={DIGEST_LABEL}={digest}",
            self.p,
            "--quiet",
        )
        return url

    def job(self, job: Job, url: str) -> None:
        location = f"--location={self.c.region}"
        wanted = JobSettings.wanted(job, url, self.c.invoker_email)
        flags = wanted.flags()
        current = self.g.read("scheduler", "jobs", "describe", job.name, location, self.p)
        if current is None:
            self.g.change("scheduler", "jobs", "create", "http", job.name, location, *flags, self.p)
        elif JobSettings.described(current) != wanted:
            self.g.change("scheduler", "jobs", "update", "http", job.name, location, *flags, self.p)
        else:
            self.g.unchanged(f"scheduler job {job.name}")

    def grant_project_role(self, member: str, role: str) -> None:
        # Firestore access has no narrower resource to grant on than the project.
        policy = self.g.read("projects", "get-iam-policy", self.c.project)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} for {member}")
        else:
            self.g.change(
                "projects",
                "add-iam-policy-binding",
                self.c.project,
                f"--member={member}",
                f"--role={role}",
                "--condition=None",
            )

    def grant_on_queue(self, queue: Queue, member: str) -> None:
        location = f"--location={self.c.region}"
        role = "roles/cloudtasks.enqueuer"
        policy = self.g.read("tasks", "queues", "get-iam-policy", queue.name, location, self.p)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} on queue {queue.name} for {member}")
        else:
            self.g.change(
                "tasks",
                "queues",
                "add-iam-policy-binding",
                queue.name,
                location,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    def grant_on_account(self, email: str, member: str, role: str) -> None:
        policy = self.g.read("iam", "service-accounts", "get-iam-policy", email, self.p)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} on {email} for {member}")
        else:
            self.g.change(
                "iam",
                "service-accounts",
                "add-iam-policy-binding",
                email,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    def grant_on_service(self, member: str, role: str) -> None:
        region = f"--region={self.c.region}"
        policy = self.g.read("run", "services", "get-iam-policy", self.c.service, region, self.p)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} on service {self.c.service} for {member}")
        else:
            self.g.change(
                "run",
                "services",
                "add-iam-policy-binding",
                self.c.service,
                region,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    # ---- Proxy jobs: the worker starts a Google Cloud API target (worker.targets) --------------
    # Each grant gives the worker's runtime account only the target's role, on the narrowest
    # resource that takes it (PROXY_GRANTS says which, and why).

    def proxy_grants(self) -> None:
        member = f"serviceAccount:{self.c.worker_email}"
        for job in self.c.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope == "project":
                    self.grant_on_target_project(job.proxy.project, member, role)
                else:
                    self.grant_on_run_job(job.proxy, member, role)

    def proxy_teardown(self) -> None:
        """Remove the project-wide proxy grants (resource grants go with the deleted account)."""
        member = f"serviceAccount:{self.c.worker_email}"
        for job in self.c.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope != "project":
                    continue
                policy = self.g.read("projects", "get-iam-policy", job.proxy.project)
                if has_binding(policy, member, role) or self.g.dry_run:
                    self.g.change(
                        "projects",
                        "remove-iam-policy-binding",
                        job.proxy.project,
                        f"--member={member}",
                        f"--role={role}",
                        "--condition=None",
                    )

    def grant_on_target_project(self, project: str, member: str, role: str) -> None:
        policy = self.g.read("projects", "get-iam-policy", project)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} on project {project} for {member}")
        else:
            self.g.change(
                "projects",
                "add-iam-policy-binding",
                project,
                f"--member={member}",
                f"--role={role}",
                "--condition=None",
            )

    def grant_on_run_job(self, proxy: Proxy, member: str, role: str) -> None:
        where = (proxy.name, f"--region={proxy.location}", f"--project={proxy.project}")
        policy = self.g.read("run", "jobs", "get-iam-policy", *where)
        if has_binding(policy, member, role):
            self.g.unchanged(f"{role} on job {proxy.name} for {member}")
        else:
            self.g.change(
                "run",
                "jobs",
                "add-iam-policy-binding",
                *where,
                f"--member={member}",
                f"--role={role}",
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the directory Cloud Run builds the worker from"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument("--teardown", action="store_true", help="delete what deploy created")
    parser.add_argument("--gcloud", default="gcloud", help="the gcloud executable")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        source = args.source.resolve()
        deployer = Deployer(config, Gcloud(dry_run=args.dry_run, executable=args.gcloud), source)
        if args.teardown:
            deployer.teardown()
        else:
            problems = check_source(source, config.router) or check_proxy_source(source, config)
            if problems:
                raise DeployError(
                    f"the worker built from {source} could not start:\n"
                    + "\n".join(f"  - {p}" for p in problems)
                )
            ensure_procfile(source, dry_run=args.dry_run)
            deployer.deploy()
    except DeployError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

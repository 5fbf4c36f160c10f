"""IAM grants of a deploy, each on the narrowest resource that takes it, added only where
missing; the proxy jobs' grants (PROXY_GRANTS says which resource, and why)."""

from __future__ import annotations

from tasklease.deploy.config import Config, Queue
from tasklease.deploy.gcloud import Gcloud, has_binding
from tasklease.deploy.proxies import PROXY_GRANTS
from tasklease.jobs import Proxy

# Project bindings are unconditional (gcloud asks which condition otherwise).
NO_CONDITION = ("--condition=None",)


class Grants:
    def __init__(self, config: Config, gcloud: Gcloud) -> None:
        self.config = config
        self.gcloud = gcloud
        self.project_flag = f"--project={config.project}"

    def grant(
        self,
        kind: tuple[str, ...],
        where: tuple[str, ...],
        member: str,
        role: str,
        what: str,
        *,
        flags: tuple[str, ...] = (),
        binding_flags: tuple[str, ...] = (),
    ) -> None:
        """Bind ``role`` to ``member`` on the resource ``gcloud KIND ... WHERE`` names, unless
        its policy already does; ``flags`` go on both calls, ``binding_flags`` on the change."""
        policy = self.gcloud.read(*kind, "get-iam-policy", *where, *flags)
        if has_binding(policy, member, role):
            self.gcloud.unchanged(what)
            return
        self.gcloud.change(
            *kind,
            "add-iam-policy-binding",
            *where,
            f"--member={member}",
            f"--role={role}",
            *flags,
            *binding_flags,
        )

    def on_project(self, member: str, role: str) -> None:
        # Firestore access has no narrower resource to grant on than the project.
        project = self.config.project
        self.grant(
            ("projects",),
            (project,),
            member,
            role,
            f"{role} for {member}",
            binding_flags=NO_CONDITION,
        )

    def on_queue(self, queue: Queue, member: str) -> None:
        role = "roles/cloudtasks.enqueuer"
        self.grant(
            ("tasks", "queues"),
            (queue.name, f"--location={self.config.region}"),
            member,
            role,
            f"{role} on queue {queue.name} for {member}",
            flags=(self.project_flag,),
        )

    def on_account(self, email: str, member: str, role: str) -> None:
        self.grant(
            ("iam", "service-accounts"),
            (email,),
            member,
            role,
            f"{role} on {email} for {member}",
            flags=(self.project_flag,),
        )

    def on_service(self, member: str, role: str) -> None:
        service = self.config.service
        self.grant(
            ("run", "services"),
            (service, f"--region={self.config.region}"),
            member,
            role,
            f"{role} on service {service} for {member}",
            flags=(self.project_flag,),
        )

    def on_target_project(self, project: str, member: str, role: str) -> None:
        what = f"{role} on project {project} for {member}"
        self.grant(("projects",), (project,), member, role, what, binding_flags=NO_CONDITION)

    def on_run_job(self, proxy: Proxy, member: str, role: str) -> None:
        where = (proxy.name, f"--region={proxy.location}", f"--project={proxy.project}")
        self.grant(("run", "jobs"), where, member, role, f"{role} on job {proxy.name} for {member}")

    def for_proxies(self) -> None:
        member = f"serviceAccount:{self.config.worker_email}"
        for job in self.config.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope == "project":
                    self.on_target_project(job.proxy.project, member, role)
                else:
                    self.on_run_job(job.proxy, member, role)

    def revoke_for_proxies(self) -> None:
        """Remove the project-wide proxy grants (resource grants go with the deleted account)."""
        member = f"serviceAccount:{self.config.worker_email}"
        for job in self.config.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope != "project":
                    continue
                policy = self.gcloud.read("projects", "get-iam-policy", job.proxy.project)
                if has_binding(policy, member, role) or self.gcloud.dry_run:
                    self.gcloud.change(
                        "projects",
                        "remove-iam-policy-binding",
                        job.proxy.project,
                        f"--member={member}",
                        f"--role={role}",
                        *NO_CONDITION,
                    )

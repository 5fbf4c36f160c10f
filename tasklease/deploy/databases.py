"""The store of a deploy (``store`` in tasklease.toml): the APIs it needs, the database and
the runtime account's grants on it, the worker's flags for it, and what a teardown removes."""

from __future__ import annotations

from tasklease.deploy.config import Config
from tasklease.deploy.errors import DeployError
from tasklease.deploy.firestore import ensure_firestore
from tasklease.deploy.gcloud import Gcloud, has_binding
from tasklease.deploy.iam import NO_CONDITION, Grants

STORE_APIS = {
    "firestore": ("firestore.googleapis.com",),
    # Cloud Run's Cloud SQL connection needs the Cloud SQL Admin API (connect-run, "Before you
    # begin"); the password is a Secret Manager secret.
    "postgresql": ("sqladmin.googleapis.com", "secretmanager.googleapis.com"),
    "spanner": ("spanner.googleapis.com",),
}
# The role the runtime account gets on the project, where no narrower resource takes it:
# Firestore access, and Cloud SQL's connect (roles/cloudsql.client, granted on the project).
PROJECT_ROLES = {"firestore": "roles/datastore.user", "postgresql": "roles/cloudsql.client"}


def ensure_database(config: Config, gcloud: Gcloud) -> None:
    """Create what is missing of the store's database. A Cloud SQL or Spanner instance is never
    created (its size and cost are the owner's choice): a real deploy without one is refused."""
    if config.store == "postgresql" and config.postgresql is not None:
        pg = config.postgresql
        project = f"--project={pg.project}"
        describe = ("sql", "instances", "describe", pg.instance_id, project)
        exists(gcloud, "Cloud SQL instance", pg.instance, *describe)
        where = (pg.database, f"--instance={pg.instance_id}", project)
        if gcloud.read("sql", "databases", "describe", *where) is None:
            gcloud.change("sql", "databases", "create", *where)
        else:
            gcloud.unchanged(f"Cloud SQL database {pg.database}")
        own = f"--project={config.project}"
        secret = pg.password_secret
        exists(gcloud, "Secret Manager secret", secret, "secrets", "describe", secret, own)
    elif config.store == "spanner" and config.spanner is not None:
        sp, project = config.spanner, f"--project={config.project}"
        describe = ("spanner", "instances", "describe", sp.instance, project)
        exists(gcloud, "Spanner instance", sp.instance, *describe)
        database = (sp.database, f"--instance={sp.instance}", project)
        if gcloud.read("spanner", "databases", "describe", *database) is None:
            gcloud.change("spanner", "databases", "create", *database)
        else:
            gcloud.unchanged(f"Spanner database {sp.database}")
        # The store creates its tables and their row deletion policies (Spanner's TTL) itself
        # (tasklease.worker.stores.spanner.schema); roles/spanner.databaseUser may update DDL.
    else:
        ensure_firestore(config, gcloud)


def grant_store(config: Config, grants: Grants) -> None:
    """Grant the runtime account its role on the store, on the narrowest resource taking it."""
    member = f"serviceAccount:{config.worker_email}"
    if config.store == "postgresql" and config.postgresql is not None:
        pg = config.postgresql
        role = "roles/cloudsql.client"  # Granted on projects, not on single instances.
        what = f"{role} on project {pg.project} for {member}"
        grants.grant(("projects",), (pg.project,), member, role, what, binding_flags=NO_CONDITION)
        role, secret = "roles/secretmanager.secretAccessor", pg.password_secret
        grants.grant(
            ("secrets",),
            (secret,),
            member,
            role,
            f"{role} on secret {secret} for {member}",
            flags=(f"--project={config.project}",),
        )
    elif config.store == "spanner" and config.spanner is not None:
        sp, role = config.spanner, "roles/spanner.databaseUser"
        grants.grant(
            ("spanner", "databases"),
            (sp.database, f"--instance={sp.instance}"),
            member,
            role,
            f"{role} on database {sp.database} for {member}",
            flags=(f"--project={config.project}",),
        )
    else:
        grants.on_project(member, "roles/datastore.user")


def exists(gcloud: Gcloud, what: str, name: str, *describe: str) -> None:
    """Refuse a real deploy whose ``what`` is missing (a dry run finds nothing, and goes on)."""
    if gcloud.read(*describe) is None and not gcloud.dry_run:
        raise DeployError(f"{what} {name} does not exist: create it first (see the deploy how-to)")


def worker_flags(config: Config) -> list[str]:
    """The ``gcloud run deploy`` flags the store needs: the Cloud SQL socket and the password."""
    if config.store == "postgresql" and config.postgresql is not None:
        return [
            f"--add-cloudsql-instances={config.postgresql.instance}",
            config.postgresql.secret_flag,
        ]
    return []


def teardown_store(config: Config, gcloud: Gcloud) -> str:
    """Remove the runtime account's roles on the store (before the account goes: a binding of
    a deleted account no longer names it); say what is kept."""
    member = f"serviceAccount:{config.worker_email}"
    role = PROJECT_ROLES.get(config.store)
    if role is not None:
        pg = config.postgresql if config.store == "postgresql" else None
        project = pg.project if pg is not None else config.project
        gcloud.change(
            "projects",
            "remove-iam-policy-binding",
            project,
            f"--member={member}",
            f"--role={role}",
            *NO_CONDITION,
        )
    own = f"--project={config.project}"
    if config.store == "postgresql" and config.postgresql is not None:
        secret = config.postgresql.password_secret
        revoke(gcloud, ("secrets",), (secret, own), member, "roles/secretmanager.secretAccessor")
        return f"the Cloud SQL database {config.postgresql.database}, its data and its secret"
    if config.store == "spanner" and config.spanner is not None:
        sp = config.spanner
        where = (sp.database, f"--instance={sp.instance}", own)
        revoke(gcloud, ("spanner", "databases"), where, member, "roles/spanner.databaseUser")
        return f"the Spanner database {sp.database} and its data"
    return f"the Firestore database {config.database} and its data"


def revoke(
    gcloud: Gcloud, kind: tuple[str, ...], where: tuple[str, ...], member: str, role: str
) -> None:
    """Remove ``role`` of ``member`` from the resource's policy, if it is there."""
    policy = gcloud.read(*kind, "get-iam-policy", *where)
    if has_binding(policy, member, role) or gcloud.dry_run:
        gcloud.change(
            *kind, "remove-iam-policy-binding", *where, f"--member={member}", f"--role={role}"
        )

"""The Firestore database of a deploy: the database, the TTL policies that delete expired run
records, lapsed locks, old delivery counts and expired joins, and the composite indexes the run
listings query."""

from __future__ import annotations

from tasklease.deploy.config import Config
from tasklease.deploy.gcloud import Gcloud


def ensure_firestore(config: Config, gcloud: Gcloud) -> None:
    """Create what is missing of the database, its TTL policies and its indexes."""
    project = f"--project={config.project}"
    database = f"--database={config.database}"
    if gcloud.read("firestore", "databases", "describe", database, project) is None:
        gcloud.change(
            "firestore",
            "databases",
            "create",
            database,
            f"--location={config.firestore_location}",
            "--type=firestore-native",
            project,
        )
    else:
        gcloud.unchanged(f"Firestore database {config.database}")
    ensure_ttl_policy(gcloud, config.collection, "expire_at", database, project)
    # A lock decides nothing from its lapses_at on (tasklease.worker.core.locking.lapses_at).
    ensure_ttl_policy(gcloud, config.lock_collection, "lapses_at", database, project)
    # The dashboard's delivery counts: kept two hours (stores.delivery_tally.TALLY_KEPT).
    ensure_ttl_policy(gcloud, config.tally_collection, "expire_at", database, project)
    # Joins (fan_out(..., then=...)): the root, each shard and each entry carry expire_at.
    for collection in config.fan_in_collections:
        ensure_ttl_policy(gcloud, collection, "expire_at", database, project)
    ensure_listing_indexes(gcloud, config.collection, database, project)


def ensure_ttl_policy(
    gcloud: Gcloud, collection: str, field: str, database: str, project: str
) -> None:
    """A TTL policy on ``field`` of ``collection``, unless one is active or being created."""
    group = f"--collection-group={collection}"
    ttl = gcloud.read("firestore", "fields", "ttls", "list", group, database, project) or []
    if any(
        str(entry.get("name", "")).endswith(f"/fields/{field}")
        and entry.get("ttlConfig", {}).get("state") in ("ACTIVE", "CREATING")
        for entry in ttl
    ):
        gcloud.unchanged(f"TTL policy on {field}")
        return
    gcloud.change(
        "firestore",
        "fields",
        "ttls",
        "update",
        field,
        group,
        "--enable-ttl",
        database,
        project,
        "--async",
    )


def ensure_listing_indexes(gcloud: Gcloud, collection: str, database: str, project: str) -> None:
    """Listing runs newest first, by status (the dead-letter listing, ``tasklease runs``) or by
    handler (``tasklease runs list --handler``): one equality field, then claimed_at."""
    group = f"--collection-group={collection}"
    indexes = gcloud.read("firestore", "indexes", "composite", "list", database, project) or []
    for first in ("status", "handler"):
        wanted = [(first, "ASCENDING"), ("claimed_at", "DESCENDING")]
        if any(
            f"/collectionGroups/{collection}/" in index.get("name", "")
            and [(f.get("fieldPath"), f.get("order")) for f in index.get("fields", [])][:2]
            == wanted
            for index in indexes
        ):
            gcloud.unchanged(f"index on {first} + claimed_at")
            continue
        gcloud.change(
            "firestore",
            "indexes",
            "composite",
            "create",
            group,
            f"--field-config=field-path={first},order=ascending",
            "--field-config=field-path=claimed_at,order=descending",
            database,
            project,
            "--async",
        )

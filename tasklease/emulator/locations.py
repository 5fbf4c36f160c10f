"""Cloud locations: which location ids the emulator accepts, and the ListLocations answer."""

from __future__ import annotations

from typing import Any

# Google Cloud regions (cloud.google.com/about/locations, 2025). Cloud Tasks and Cloud
# Scheduler take a region as the location; anything else ("l", "global", "us") is refused.
REGIONS = frozenset(
    {
        "africa-south1",
        "asia-east1",
        "asia-east2",
        "asia-northeast1",
        "asia-northeast2",
        "asia-northeast3",
        "asia-south1",
        "asia-south2",
        "asia-southeast1",
        "asia-southeast2",
        "australia-southeast1",
        "australia-southeast2",
        "europe-central2",
        "europe-north1",
        "europe-north2",
        "europe-southwest1",
        "europe-west1",
        "europe-west2",
        "europe-west3",
        "europe-west4",
        "europe-west6",
        "europe-west8",
        "europe-west9",
        "europe-west10",
        "europe-west12",
        "me-central1",
        "me-central2",
        "me-west1",
        "northamerica-northeast1",
        "northamerica-northeast2",
        "northamerica-south1",
        "southamerica-east1",
        "southamerica-west1",
        "us-central1",
        "us-east1",
        "us-east4",
        "us-east5",
        "us-south1",
        "us-west1",
        "us-west2",
        "us-west3",
        "us-west4",
    }
)
DEFAULT_LOCATION = "us-central1"
REGION_LABEL = "cloud.googleapis.com/region"


def is_region(location_id: str) -> bool:
    return location_id in REGIONS


def location(project: str, location_id: str) -> dict[str, Any]:
    """A Location resource as REST JSON."""
    return {
        "name": f"projects/{project}/locations/{location_id}",
        "locationId": location_id,
        "labels": {REGION_LABEL: location_id},
    }


def list_locations(project: str, default: str = DEFAULT_LOCATION) -> list[dict[str, Any]]:
    """Every region, ``default`` first: gcloud takes the first one as the project's location
    when the project has an App Engine app (googlecloudsdk/command_lib/tasks/app.py)."""
    return [location(project, default)] + [
        location(project, region) for region in sorted(REGIONS - {default})
    ]

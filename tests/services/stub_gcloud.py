"""A stand-in for the gcloud CLI, for the deploy tests.

It appends each call's arguments to the JSON-lines file named by STUB_GCLOUD_LOG and keeps
the resources it "creates" in the JSON file named by STUB_GCLOUD_STATE, answering describe,
list and get-iam-policy calls from it as gcloud would (JSON on stdout, or NOT_FOUND on stderr
with exit code 1), so a second deploy finds everything the first one made.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

NOT_FOUND = 1


def option(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def positional(args: list[str], index: int) -> str:
    return [arg for arg in args if not arg.startswith("--")][index]


def grant(state: dict[str, Any], resource: str, args: list[str]) -> None:
    bindings = state["policies"].setdefault(resource, [])
    role, member = option(args, "role"), option(args, "member")
    for binding in bindings:
        if binding["role"] == role:
            binding["members"] = sorted({*binding["members"], member})
            return
    bindings.append({"role": role, "members": [member]})


def main(args: list[str]) -> int:
    log_path, state_path = (
        Path(os.environ["STUB_GCLOUD_LOG"]),
        Path(os.environ["STUB_GCLOUD_STATE"]),
    )
    with log_path.open("a") as log:
        log.write(json.dumps(args) + "\n")
    state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.exists() else {}
    for key in (
        "services",
        "databases",
        "ttl",
        "indexes",
        "accounts",
        "queues",
        "run",
        "jobs",
        "policies",
    ):
        state.setdefault(key, {} if key not in ("services", "indexes") else [])

    def answer(value: Any) -> int:
        print(json.dumps(value))
        return 0

    def missing(what: str) -> int:
        print(f"ERROR: (gcloud) NOT_FOUND: {what} was not found", file=sys.stderr)
        return NOT_FOUND

    words = [arg for arg in args if not arg.startswith("--")]
    command = " ".join(words[:3])
    result = 0
    if command.startswith("projects describe"):
        result = answer({"projectId": words[2], "projectNumber": "123456789"})
    elif command == "services list":
        result = answer([{"config": {"name": name}} for name in state["services"]])
    elif command.startswith("services enable"):
        state["services"] = sorted({*state["services"], *words[2:]})
    elif command == "firestore databases describe":
        database = option(args, "database")
        result = (
            answer(state["databases"][database])
            if database in state["databases"]
            else missing("database")
        )
    elif command == "firestore databases create":
        state["databases"][option(args, "database")] = {"type": option(args, "type")}
    elif command == "firestore fields ttls":
        group = option(args, "collection-group")
        if words[3] == "list":
            enabled = state["ttl"].get(group, [])
            result = answer(
                [
                    {
                        "name": f"x/collectionGroups/{group}/fields/{name}",
                        "ttlConfig": {"state": "ACTIVE"},
                    }
                    for name in enabled
                ]
            )
        else:
            state["ttl"][group] = sorted({*state["ttl"].get(group, []), words[4]})
    elif command == "firestore indexes composite":
        if words[3] == "list":
            result = answer(state["indexes"])
        else:
            fields = [
                dict(part.split("=") for part in value.split(","))
                for value in (a.split("=", 1)[1] for a in args if a.startswith("--field-config="))
            ]
            group = option(args, "collection-group")
            state["indexes"].append(
                {
                    "name": f"projects/p/databases/d/collectionGroups/{group}/indexes/1",
                    "fields": [
                        {"fieldPath": f["field-path"], "order": f["order"].upper()} for f in fields
                    ],
                }
            )
    elif command == "iam service-accounts describe":
        email = words[3]
        result = answer({"email": email}) if email in state["accounts"] else missing(email)
    elif command == "iam service-accounts create":
        project = option(args, "project")
        state["accounts"][f"{words[3]}@{project}.iam.gserviceaccount.com"] = {}
    elif command == "iam service-accounts delete":
        state["accounts"].pop(words[3], None)
    elif command.startswith("projects get-iam-policy") or command in (
        "iam service-accounts get-iam-policy",
        "tasks queues get-iam-policy",
        "run services get-iam-policy",
        "run jobs get-iam-policy",
    ):
        resource = f"{words[0]}:{words[-1]}"
        result = answer({"bindings": state["policies"].get(resource, [])})
    elif command.startswith("projects add-iam-policy-binding"):
        grant(state, f"projects:{words[2]}", args)
    elif command.startswith("projects remove-iam-policy-binding"):
        pass
    elif command in (
        "iam service-accounts add-iam-policy-binding",
        "tasks queues add-iam-policy-binding",
        "run services add-iam-policy-binding",
        "run jobs add-iam-policy-binding",
    ):
        grant(state, f"{words[0]}:{words[3]}", args)
    elif command == "tasks queues describe":
        queue = state["queues"].get(words[3])
        result = answer(queue) if queue else missing(f"queue {words[3]}")
    elif command in ("tasks queues create", "tasks queues update"):
        state["queues"][words[3]] = {
            "rateLimits": {
                "maxDispatchesPerSecond": float(option(args, "max-dispatches-per-second") or 0),
                "maxConcurrentDispatches": int(option(args, "max-concurrent-dispatches") or 0),
                "maxBurstSize": 100,
            },
            "retryConfig": {
                "maxAttempts": int(option(args, "max-attempts") or 0),
                "maxRetryDuration": option(args, "max-retry-duration"),
                "minBackoff": option(args, "min-backoff"),
                "maxBackoff": option(args, "max-backoff"),
                "maxDoublings": int(option(args, "max-doublings") or 0),
            },
        }
    elif command == "tasks queues delete":
        state["queues"].pop(words[3], None)
    elif command == "run services describe":
        service = state["run"].get(words[3])
        result = answer(service) if service else missing(f"service {words[3]}")
    elif command.startswith("run deploy"):
        label = option(args, "labels") or "="
        key, value = label.split("=", 1)
        state["run"][words[2]] = {"metadata": {"labels": {key: value}}}
    elif command == "run services delete":
        state["run"].pop(words[3], None)
    elif command == "scheduler jobs describe":
        job = state["jobs"].get(words[3])
        result = answer(job) if job else missing(f"job {words[3]}")
    elif command.startswith(("scheduler jobs create", "scheduler jobs update")):
        state["jobs"][words[4]] = {
            "schedule": option(args, "schedule"),
            "timeZone": option(args, "time-zone"),
            "httpTarget": {
                "uri": option(args, "uri"),
                "httpMethod": "POST",
                "oidcToken": {
                    "serviceAccountEmail": option(args, "oidc-service-account-email"),
                    "audience": option(args, "oidc-token-audience"),
                },
            },
            "attemptDeadline": option(args, "attempt-deadline"),
            "retryConfig": {
                "retryCount": int(option(args, "max-retry-attempts") or 0),
                "minBackoffDuration": option(args, "min-backoff"),
                "maxBackoffDuration": option(args, "max-backoff"),
                "maxDoublings": int(option(args, "max-doublings") or 0),
            },
        }
    elif command == "scheduler jobs delete":
        state["jobs"].pop(words[3], None)
    else:
        print(f"stub gcloud: unknown command {args}", file=sys.stderr)
        return 2
    state_path.write_text(json.dumps(state))
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

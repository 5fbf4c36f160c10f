"""The source Cloud Run builds the worker from: what would keep that worker from starting,
found before any gcloud call, its Procfile, and the digest that tells an unchanged deploy."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tomllib
from pathlib import Path

from tasklease import protocol
from tasklease.deploy.config import Config
from tasklease.deploy.errors import DeployError
from tasklease.deploy.proxies import PROXY_LIBRARIES

# What the deployed worker imports that the buildpack must install (docs/platform-facts.md, "Cloud
# Run deploys from source"): the Procfile's server and the production store. tasklease lists
# gunicorn and the Firestore client as plain dependencies, so a source that installs tasklease
# installs them; the Postgres and Spanner clients come with its extras (pyproject.toml).
WORKER_NEEDS = ("gunicorn", "google-cloud-firestore")
ASGI_NEEDS = ("uvicorn", "anyio")  # server = "uvicorn": what tasklease[asgi] adds.
TASKLEASE_EXTRAS = {
    "firestore": ("google-cloud-firestore",),
    "postgres": ("psycopg", "psycopg-pool"),
    "spanner": ("google-cloud-spanner",),
    "asgi": ASGI_NEEDS,
}
# Each deploy store (tasklease.toml's ``store``): the requirement that installs its client.
STORE_REQUIREMENTS = {
    "firestore": ("tasklease[firestore]", "the Firestore store"),
    "postgresql": ("tasklease[postgres]", "the Postgres store"),
    "spanner": ("tasklease[spanner]", "the Spanner store"),
}
# A header field as large as Cloud Tasks may deliver (a task's headers: under 80 KB in all,
# docs/platform-facts.md); gunicorn's default, 8190 bytes, answers a larger one 400 itself.
PROCFILE = (
    "web: gunicorn --bind :$PORT --workers ${WEB_CONCURRENCY:-2} --threads "
    "${GUNICORN_THREADS:-8} --timeout ${GUNICORN_TIMEOUT:-0} --access-logfile - "
    f"--limit-request-field_size {protocol.MAX_TASK_HEADER_BYTES} "
    "'tasklease.worker.wsgi:app'\n"
)
# uvicorn with TCP_NODELAY kept under --workers (tasklease.worker.asgi_serve says why); Cloud
# Run gives an instance 10 s between SIGTERM and SIGKILL: finish what is running first.
UVICORN_PROCFILE = (
    "web: python -m tasklease.worker.asgi_serve tasklease.worker.asgi:app_from_env "
    "--port $PORT --workers ${WEB_CONCURRENCY:-2} --timeout-graceful-shutdown 8\n"
)
PROCFILES = {"gunicorn": PROCFILE, "uvicorn": UVICORN_PROCFILE}
_NOT_SOURCE = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache"}
# A PEP 508 requirement's name and extras: ``name``, ``name[a,b]``, ``name [ a , b ] >= 1``.
_REQUIREMENT = re.compile(
    r"\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?"
)


def check_source(
    source: Path, router: str, *, store: str = "firestore", server: str = "gunicorn"
) -> list[str]:
    """What would keep the worker built from ``source`` from starting, found before any gcloud
    call: the buildpack installs ``requirements.txt`` if present, else the ``[project]``
    dependencies of ``pyproject.toml``, never extras; gunicorn imports
    ``tasklease.worker.wsgi``, which imports the router module from the source. With
    ``server="uvicorn"`` the source must install ``tasklease[asgi]`` (uvicorn and anyio)."""
    if not source.is_dir():
        return [f"source {source} is not a directory"]
    problems = []
    try:
        installed, what = _installed_by_buildpack(source)
    except DeployError as exc:
        installed, what = set(), ""
        problems.append(str(exc))
    if what and "tasklease" not in installed:
        problems.append(
            f"{what} does not install tasklease: the worker (tasklease.worker.wsgi) would not "
            "import. "
            "Add tasklease to it (not as an extra of your own project: the buildpack installs "
            "no extras)"
        )
    elif what:
        missing = [name for name in WORKER_NEEDS[:1] if name not in installed]
        if missing:
            problems.append(
                f"{what} does not install {', '.join(missing)}: the Procfile's gunicorn needs "
                "it as a plain dependency (the buildpack installs no extras)"
            )
        missing = [name for name in ASGI_NEEDS if name not in installed]
        if server == "uvicorn" and missing:
            problems.append(
                f'{what} does not install {", ".join(missing)}: server = "uvicorn" needs '
                "tasklease[asgi] there (an extra of tasklease itself is installed; one of your "
                "own project is not)"
            )
        problems += _store_problems(store, installed, what)
    module = router.partition(":")[0]
    if not _module_in_source(source, module):
        problems.append(
            f"router {router}: no module {module} in {source} (looked for "
            f"{module.replace('.', '/')}.py or a package, also under src/)"
        )
    procfile = source / "Procfile"
    if procfile.exists() and not any(
        line.startswith("web:") for line in procfile.read_text().splitlines()
    ):
        problems.append(f"{procfile} has no web: line, the entrypoint Cloud Run starts")
    return problems


def _store_problems(store: str, installed: set[str], what: str) -> list[str]:
    """The store's client library not installed: name the requirement line that installs it."""
    line, meaning = STORE_REQUIREMENTS[store]
    extra = line.partition("[")[2].rstrip("]")
    missing = [name for name in TASKLEASE_EXTRAS[extra] if name not in installed]
    if not missing:
        return []
    where = (
        f'"{line}" to [project].dependencies'
        if what.endswith("([project] dependencies)")
        else f"the line {line}"
    )
    return [
        f"{what} does not install {', '.join(missing)}, which {meaning} (store = {store!r}) "
        f"imports: add {where} (in place of tasklease; the buildpack installs the extras of "
        "a dependency, never your own project's)"
    ]


def ensure_procfile(source: Path, *, dry_run: bool, server: str = "gunicorn") -> None:
    """Write tasklease's Procfile for ``server`` into ``source`` unless it has one (the
    buildpack reads it)."""
    procfile = source / "Procfile"
    if procfile.exists():
        return
    text = PROCFILES[server]
    if dry_run:
        print(f"# would write {procfile}: {text.strip()}")
        return
    procfile.write_text(text)
    print(f"wrote {procfile}")


# What the upload of ``--source`` leaves out when the source has no .gcloudignore of its own:
# virtual environments, caches and local stores are never what Cloud Run builds from.
GCLOUDIGNORE = """\
# Written by tasklease deploy: what `gcloud run deploy --source` does not upload.
.gcloudignore
.git/
.venv/
venv/
env/
__pycache__/
*.pyc
.mypy_cache/
.pytest_cache/
.ruff_cache/
node_modules/
.tasklease/
*.db
*.db-wal
*.db-shm
"""


def ensure_gcloudignore(source: Path, *, dry_run: bool) -> None:
    """Give ``source`` a .gcloudignore unless it has one, so a local virtual environment or
    store is not uploaded (gcloud uploads every file it is not told to skip)."""
    ignore = source / ".gcloudignore"
    if ignore.exists():
        return
    text = GCLOUDIGNORE + ("#!include:.gitignore\n" if (source / ".gitignore").exists() else "")
    if dry_run:
        print(f"# would write {ignore}: skips .venv/, .git/, caches and local stores")
        return
    ignore.write_text(text)
    print(f"wrote {ignore}")


def check_proxy_source(source: Path, config: Config) -> list[str]:
    """Each proxy job's client library installed by the buildpack, or its runs would all fail."""
    kinds = sorted({job.proxy.kind for job in config.jobs if job.proxy is not None})
    if not kinds:
        return []
    try:
        installed, what = _installed_by_buildpack(source)
    except DeployError:
        return []  # check_source reported it.
    missing = [PROXY_LIBRARIES[kind] for kind in kinds if PROXY_LIBRARIES[kind] not in installed]
    if not missing:
        return []
    return [
        f"{what} does not install {', '.join(missing)}: the proxy jobs' targets import it. "
        "Add it as a plain dependency (the buildpack installs no extras)"
    ]


def digest(flags: list[str], source: Path) -> str:
    """The source tree (git's view of it, else every file) and the deploy settings, hashed."""
    hasher = hashlib.sha256("\n".join(flags).encode())
    for name in _source_files(source):
        path = source / name.decode()
        if path.is_file():
            hasher.update(name + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:16]


def _source_files(source: Path) -> list[bytes]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        return sorted(filter(None, listed.stdout.split(b"\0")))
    names = []
    for directory, subdirectories, files in os.walk(source):
        subdirectories[:] = sorted(d for d in subdirectories if d not in _NOT_SOURCE)
        for file in files:
            names.append(str(Path(directory, file).relative_to(source)).encode())
    return sorted(names)


def _installed_by_buildpack(source: Path) -> tuple[set[str], str]:
    """The normalised names of what the buildpack installs from ``source``, and from where."""
    requirements = source / "requirements.txt"
    if requirements.exists():
        return _requirements(requirements, source, seen=set()), str(requirements)
    if (source / "pyproject.toml").exists():
        return _project(source), f"{source / 'pyproject.toml'} ([project] dependencies)"
    raise DeployError(
        f"{source} has neither requirements.txt nor pyproject.toml: the buildpack would install "
        "nothing, and the worker could not start"
    )


def _project(directory: Path, extras: frozenset[str] = frozenset()) -> set[str]:
    """A pyproject project's own name and its [project] dependencies, with those of ``extras``
    (a local requirement such as ``.[postgres]``; the buildpack itself asks for none)."""
    try:
        project = tomllib.loads((directory / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeployError(f"cannot read {directory / 'pyproject.toml'}: {exc}") from exc
    if not project:
        raise DeployError(
            f"{directory / 'pyproject.toml'} has no [project] table: the buildpack reads "
            "dependencies from [project] (or use a requirements.txt)"
        )
    names = {_normalise(project.get("name", ""))}
    optional = project.get("optional-dependencies", {})
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += next(
            (deps for key, deps in optional.items() if _normalise(key) == extra), []
        )
    for requirement in requirements:
        names |= _requirement(requirement)
    return names


def _requirements(path: Path, source: Path, seen: set[Path]) -> set[str]:
    """Names a requirements file installs: names, ``name @ url``, ``#egg=name``, ``-r`` files
    and local projects (``.`` or ``-e ./dir``) inside the source."""
    if path in seen or not path.exists():
        return set()
    seen.add(path)
    names: set[str] = set()
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option, _, value = line.partition(" ")
        if option in ("-r", "--requirement"):
            names |= _requirements(path.parent / value.strip(), source, seen)
            continue
        if option in ("-e", "--editable"):
            line = value.strip()
        elif line.startswith("-"):
            continue  # --index-url, -c, --hash ...: no package named.
        if "#egg=" in line:
            names |= _requirement(line.split("#egg=", 1)[1].split("&")[0])
        elif line.startswith((".", "/")):
            directory, _, extras = line.partition("[")
            local = (path.parent / directory.strip()).resolve()
            if local.is_relative_to(source.resolve()) and (local / "pyproject.toml").exists():
                names |= _project(local, _extras(extras.partition("]")[0]))
        elif "://" not in line.split("@")[0]:
            names |= _requirement(line)
    return names


def _requirement(text: str) -> set[str]:
    """What one requirement (PEP 508: ``name [extras] specifiers ; marker``) installs."""
    match = _REQUIREMENT.match(text)
    if match is None:
        return set()
    return _installs(match["name"], _extras(match["extras"] or ""))


def _extras(text: str) -> frozenset[str]:
    return frozenset(_normalise(extra.strip()) for extra in text.split(",") if extra.strip())


def _installs(requirement_name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """A requirement's name, with the worker's packages when it is tasklease (they are its
    plain dependencies, and its extras' clients; this repository's own pyproject is checked
    as a project, not so)."""
    name = _normalise(requirement_name)
    if name != "tasklease":
        return {name}
    return {name, *WORKER_NEEDS, *(lib for e in extras for lib in TASKLEASE_EXTRAS.get(e, ()))}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _module_in_source(source: Path, module: str) -> bool:
    relative = Path(*module.split(".")) if module else Path("-")
    return any(
        (root / relative).with_suffix(".py").is_file()
        or (root / relative / "__init__.py").is_file()
        for root in (source, source / "src")
    )

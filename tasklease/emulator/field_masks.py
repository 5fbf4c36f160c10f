"""An Update call's field mask applied to a resource as REST JSON, for queues and jobs. Pure.

Google's update semantics (google.protobuf.FieldMask, AIP-134): each path of the mask
(comma-separated, camelCase or snake_case, dotted into sub-messages) names a field the
update replaces, and a named field the update leaves out is cleared. Without a mask, the
update replaces every field it carries, leaf by leaf. Paths into fields the caller cannot
change (the resource's name, its output-only fields) are skipped, as the services ignore
them; a mask path that names no field of the resource is INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, NoReturn

from tasklease.emulator.errors import ApiError

Json = dict[str, Any]


class UpdateMask:
    """The fields an update replaces: the mask's paths, or the update's leaves."""

    def __init__(
        self,
        mask: str | None,
        update: Json,
        *,
        message: Any,
        fixed: Collection[str],
        maps: Collection[str] = (),
    ) -> None:
        """``message``: the resource's protobuf Descriptor, which the mask's paths must name
        fields of; ``fixed``: top-level fields no path may change; ``maps``: fields holding
        a map (such as headers), which an update without a mask replaces whole."""
        self.update = update
        self.masked = bool(mask)
        if mask:
            named = [path.strip() for path in mask.split(",") if path.strip()]
        else:
            named = _leaf_paths(update, frozenset(maps))
        paths = [[camel(part) for part in path.split(".")] for path in named]
        self.paths = [keys for keys in paths if keys[0] not in fixed]
        if mask:
            for keys in self.paths:
                _check_path(message, keys)

    @property
    def changes_nothing(self) -> bool:
        """True when a mask was given and every path it names is skipped."""
        return self.masked and not self.paths

    def apply(self, current: Json) -> Json:
        """A copy of ``current`` with each path's field taken from the update (or cleared,
        when the update does not carry it)."""
        merged: Json = json.loads(json.dumps(current))
        for keys in self.paths:
            source: Any = self.update
            for key in keys:
                source = source.get(key) if isinstance(source, dict) else None
            target = merged
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            if source is None:
                target.pop(keys[-1], None)
            else:
                target[keys[-1]] = source
        return merged


def camel(part: str) -> str:
    """A snake_case field name in camelCase, as REST JSON spells it."""
    head, *rest = part.split("_")
    return head + "".join(word.title() for word in rest)


def _check_path(message: Any, keys: list[str]) -> None:
    """INVALID_ARGUMENT unless ``keys`` names a field of ``message`` (a Descriptor), through
    singular sub-messages only: a path cannot reach into a scalar, a list or a map."""
    descriptor = message
    for depth, key in enumerate(keys):
        fields = {field.json_name: field for field in descriptor.fields}
        field = fields.get(key)
        if field is None:
            _refuse(
                message,
                keys,
                f"{key!r} is not one of {descriptor.name}'s fields " + ", ".join(fields),
            )
        if depth < len(keys) - 1:
            if field.message_type is None or field.is_repeated:
                _refuse(
                    message,
                    keys,
                    f"{key!r} is not a message, so a path cannot name fields inside it",
                )
            descriptor = field.message_type


def _refuse(message: Any, keys: list[str], reason: str) -> NoReturn:
    path = ".".join(keys)
    raise ApiError(400, f"updateMask path {path!r} is not a field of {message.name}: {reason}")


def _leaf_paths(update: Json, maps: frozenset[str], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in update.items():
        if key == "name":
            continue
        path = f"{prefix}{key}"
        nested = isinstance(value, dict) and key not in maps
        paths.extend(_leaf_paths(value, maps, path + ".") if nested else [path])
    return paths

"""Records as stored values and back, driven by the record dataclasses' own fields.

A store says only how its backend holds a time, a map and (rarely) one field, and which stored
names differ from the field names; a field added to :class:`~tasklease.worker.core.records.
RunRecord` is then stored by every store using a codec, with no second mapping to update.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Generic, TypeVar

from tasklease.worker.core.records import LockRecord, RunRecord

R = TypeVar("R", RunRecord, LockRecord)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Conversion:
    """How one kind of value is stored (``encode``) and read back (``decode``)."""

    encode: Callable[[Any], Any] = _same
    decode: Callable[[Any], Any] = _same


SAME = Conversion()


@dataclass(frozen=True)
class _Field:
    name: str  # The dataclass field's.
    stored: str  # The backend's name for it.
    conversion: Conversion
    optional: bool  # None is stored as None, never converted.
    has_default: bool


def _kind(hint: Any) -> tuple[Any, bool]:
    """The type a field holds, and whether it may be None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return members[0], len(members) < len(typing.get_args(hint))
    return hint, False


def fields_of(record_type: type[Any], kind: type) -> tuple[str, ...]:
    """The names of ``record_type``'s fields that hold a ``kind`` (None allowed or not)."""
    hints = typing.get_type_hints(record_type)
    return tuple(
        f.name
        for f in dataclasses.fields(record_type)
        if typing.get_origin(base := _kind(hints[f.name])[0]) is kind or base is kind
    )


class RecordCodec(Generic[R]):
    """Encodes a ``record_type`` field by field, in the dataclass's field order.

    - ``time``: how a ``datetime`` field is stored; ``mapping``: how a ``dict`` field is.
      An ``Enum`` field is stored as its value, an ``int`` read back through ``int``.
    - ``renames``: stored names that differ from the field names; ``skip``: fields not
      stored at all (given back on decode, e.g. a document id).
    - ``overrides``: a conversion for one field, by field name.
    """

    def __init__(
        self,
        record_type: type[R],
        *,
        time: Conversion = SAME,
        mapping: Conversion = SAME,
        renames: Mapping[str, str] | None = None,
        skip: Iterable[str] = (),
        overrides: Mapping[str, Conversion] | None = None,
    ) -> None:
        self.record_type: type[R] = record_type
        hints = typing.get_type_hints(record_type)
        renames, overrides, skipped = renames or {}, overrides or {}, set(skip)
        fields = []
        for f in dataclasses.fields(record_type):
            if f.name in skipped:
                continue
            kind, optional = _kind(hints[f.name])
            conversion = overrides.get(f.name) or _conversion(kind, time, mapping)
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            stored = renames.get(f.name, f.name)
            fields.append(_Field(f.name, stored, conversion, optional, has_default))
        self._fields = tuple(fields)
        # (field name, conversion or None when the value is stored as it is, optional): the
        # per-request loops of encode and decode read these, not the _Field objects.
        self._encoders = tuple(
            (f.name, None if f.conversion.encode is _same else f.conversion.encode, f.optional)
            for f in fields
        )
        self._decoders = tuple(
            (f.name, None if f.conversion.decode is _same else f.conversion.decode, f.optional)
            for f in fields
        )
        self.names: tuple[str, ...] = tuple(f.stored for f in fields)
        """The stored names, in field order: the order of :meth:`encode` and :meth:`decode`."""

    def encode(self, record: R) -> list[Any]:
        """The record's stored values, in :attr:`names` order."""
        values = []
        for name, encode, optional in self._encoders:
            value = getattr(record, name)
            if encode is not None and not (value is None and optional):
                value = encode(value)
            values.append(value)
        return values

    def encode_changed(self, before: R, after: R) -> tuple[tuple[str, ...], list[Any]]:
        """The stored names and values of the fields ``after`` changes from ``before``: a
        write conditional on the row holding ``before`` need send only these."""
        names: list[str] = []
        values: list[Any] = []
        for f in self._fields:
            value = getattr(after, f.name)
            if value != getattr(before, f.name):
                names.append(f.stored)
                values.append(None if value is None and f.optional else f.conversion.encode(value))
        return tuple(names), values

    def encode_map(self, record: R) -> dict[str, Any]:
        """The record as ``{stored name: stored value}`` (every field, None ones too)."""
        return dict(zip(self.names, self.encode(record), strict=True))

    def decode(self, values: Sequence[Any], **given: Any) -> R:
        """The record of stored ``values`` in :attr:`names` order (values past them are
        ignored: a row may carry more columns), with ``given`` for skipped fields."""
        decoded = dict(given)
        for (name, decode, optional), stored in zip(self._decoders, values, strict=False):
            if decode is None or (stored is None and optional):
                decoded[name] = stored
            else:
                decoded[name] = decode(stored)
        record: R = self.record_type(**decoded)
        return record

    def decode_map(self, data: Mapping[str, Any], **fallback: Any) -> R:
        """The record of a stored map. A field missing from it takes ``fallback``'s value,
        else its default (a field added since the map was written); a required one raises
        ``KeyError``."""
        decoded = {}
        for f in self._fields:
            if f.stored in data:
                decoded[f.name] = self._decoded(f, data[f.stored])
            elif f.name in fallback:
                decoded[f.name] = fallback[f.name]
            elif not f.has_default:
                raise KeyError(f.stored)
        for name, value in fallback.items():
            decoded.setdefault(name, value)
        record: R = self.record_type(**decoded)
        return record

    @staticmethod
    def _decoded(f: _Field, value: Any) -> Any:
        return None if value is None and f.optional else f.conversion.decode(value)


def _conversion(kind: Any, time: Conversion, mapping: Conversion) -> Conversion:
    if kind is datetime:
        return time
    if kind is dict or typing.get_origin(kind) is dict:
        return mapping
    if isinstance(kind, type) and issubclass(kind, Enum):
        return Conversion(lambda member: member.value, kind)
    if kind is int:
        return Conversion(_same, int)
    return SAME


__all__ = ["SAME", "Conversion", "RecordCodec", "fields_of"]

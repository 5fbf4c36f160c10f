"""Griffe extension: the docstrings' Sphinx roles and literal blocks, as Markdown.

The docstrings are written for ``help()`` and Sphinx (``:class:`Router```, ``:meth:`~a.b``,
``Example::``). This rewrites each role into a cross-reference when griffe can resolve its
target from the object's scope (an *optional* autoref: a target the site does not render
shows as plain code, never as a broken link), else into plain code, and ``::`` before a
literal block into ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``'s scope, if griffe finds it."""
    scopes: list[griffe.Object | None] = [obj, obj.parent, obj.module]
    candidates = [target]
    for scope in scopes:
        if scope is None:
            continue
        candidates.append(f"{scope.path}.{target}")
    modules = obj.modules_collection
    for candidate in candidates:
        try:
            found = modules.get_member(candidate)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        try:
            return str(found.final_target.path if found.is_alias else found.path)
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return str(found.path)
    return None


def _rewrite(obj: griffe.Object, text: str) -> str:
    def role(match: re.Match[str]) -> str:
        target = match["target"].strip()
        title = target
        if target.startswith("~"):
            target = target[1:]
            title = target.rsplit(".", 1)[-1]
        elif "<" in target and target.endswith(">"):  # :class:`title <target>`
            title, target = (part.strip() for part in target[:-1].split("<", 1))
        target = target.removesuffix("()")
        path = _resolve(obj, target)
        code = f"<code>{title}</code>"
        if path is None:
            return code
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    text = ROLE.sub(role, text)
    # reStructuredText's "Example::" ends a paragraph introducing an indented literal block.
    return re.sub(r"(\S)::\n", r"\1:\n", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring once its package is loaded (so cross-module targets exist)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg, set())

    def _visit(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._visit(member, seen)  # type: ignore[arg-type]

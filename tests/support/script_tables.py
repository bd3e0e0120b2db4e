"""Every Lua script of the project, by name: the session core's table, the worker's, the enqueue
script's, the bundles' and the LangGraph saver's (each layer owns its own; the tests and
``run.py``'s Lua check see them all)."""

from __future__ import annotations

from collections.abc import Mapping

from sessionfork.core import lua
from sessionfork.integrations import langgraph
from sessionfork.ops import bundles
from sessionfork.protocol import enqueue
from sessionfork.worker import outcomes

ALL: Mapping[str, lua.Spec] = {**lua.SCRIPTS, **outcomes.SCRIPTS, enqueue.SPEC.name: enqueue.SPEC,
                               enqueue.OUTCOME_SPEC.name: enqueue.OUTCOME_SPEC, **bundles.SCRIPTS,
                               **langgraph.SCRIPTS}

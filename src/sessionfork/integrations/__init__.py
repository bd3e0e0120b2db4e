"""Agent frameworks' storage seams over the session registry, each behind an extra.

``sessionfork.integrations.langgraph``: ``SessionforkSaver``, LangGraph's checkpointer (extra
``langgraph``).
"""

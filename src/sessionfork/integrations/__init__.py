"""sessionfork behind the storage seams of agent frameworks: each module implements one framework's
seam over the session registry and needs that framework's extra:

``sessionfork.integrations.langgraph``: ``SessionforkSaver``, LangGraph's checkpointer (extra
``langgraph``); ``sessionfork.integrations.openai_agents``: ``SessionforkSession``, the OpenAI Agents
SDK's session (extra ``openai-agents``).
"""

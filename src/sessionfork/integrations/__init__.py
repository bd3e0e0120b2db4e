"""sessionfork behind the storage seams of agent frameworks: each module implements one framework's
seam over the session registry and needs that framework's extra (``pip install
sessionfork[openai-agents]`` for ``openai_agents``)."""

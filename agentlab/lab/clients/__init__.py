"""The lab's clients: the agent under test, one per episode, played by the one loop (:mod:`agentlab.lab.loop`).

- :mod:`agentlab.lab.clients.kit`: the kit's own graph under a preset (``Lab.run``);
- :mod:`agentlab.lab.clients.graph_agent`: a LangGraph agent as its user builds it (``Yardstick.run``);
- :mod:`agentlab.lab.clients.dbos_client`, :mod:`agentlab.lab.clients.temporal_client`: a durable engine's agent,
  each life a child process (``Yardstick.run("dbos:steps" | "temporal:activities", ...)``); Pydantic AI's
  durable agent on DBOS (``"pydantic_ai:dbos"``) is the DBOS client running :mod:`agentlab.lab.clients.pydantic_ai_app`,
  and on Temporal (``"pydantic_ai:temporal"``) the Temporal client with
  :class:`agentlab.lab.clients.pydantic_ai_temporal.PydanticAITemporalAgent`, running
  :mod:`agentlab.lab.clients.pydantic_ai_temporal_app`.
"""
